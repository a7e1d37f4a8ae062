"""ferry from Python: a loader over .npy files, then one over a dataset
class written in Python. Run it from any directory: it writes two small
.npy files there first."""
import json

import numpy as np

import ferry


class Squares:
    """A dataset in Python, built in each worker as Squares(n=...)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = ferry.worker_info().rng(i)  # the same whichever worker builds item i
        noise = rng.normal(size=4).astype(np.float32)
        return {"x": np.full(4, i, dtype=np.float32) + noise, "y": i * i}


def main():
    np.save("train_x.npy", np.random.default_rng(0).random((1000, 8), dtype=np.float32))
    np.save("train_y.npy", np.arange(1000, dtype=np.int64))

    loader = ferry.Loader("npy:x=train_x.npy,y=train_y.npy", batch_size=256,
                          workers=2, prefetch=8, shuffle=True, seed=0)
    with loader:
        for epoch in range(3):
            for batch in loader:  # one epoch; prefetch runs on into the next
                x, y = batch["x"], batch["y"]  # numpy arrays, no copy
                assert x.shape[1:] == (8,) and len(x) == len(y)
            print(f"epoch {epoch}: {len(loader)} batches")
        state = loader.state_dict()  # ferry.Loader(..., state=state) goes on from here

    with ferry.Loader(Squares, dataset_kwargs={"n": 100}, batch_size=32,
                      workers=2, epochs=1) as loader:
        for batch in loader:
            try:
                import torch  # optional: tensors sharing the batch's memory
                x = batch.torch()["x"]
            except ImportError:
                x = batch["x"]
            print(f"batch {batch.index_in_epoch} from worker {batch.worker}: "
                  f"{tuple(x.shape)}, y[:3] = {batch['y'][:3].tolist()}")
    print("resume state, as JSON:", json.dumps(state))  # a checkpoint keeps it so


if __name__ == "__main__":
    main()
