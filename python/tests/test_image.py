"""The imagefolder dataset (C decode, crop and resize) against torchvision:
the same listing and labels, the same crop distribution, the same pixels
for the same crop box within a stated tolerance, the same bytes per (seed,
epoch, index) whatever the workers and after a resume, and a bad file that
fails only its batch, naming the file."""

import os

import numpy as np
import pytest

import ferry

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
Image = pytest.importorskip("PIL.Image")
from torchvision.datasets import ImageFolder  # noqa: E402
from torchvision.transforms import RandomResizedCrop  # noqa: E402
from torchvision.transforms import functional as F  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Three classes of JPEGs (and a PNG) of varied sizes, smooth with grain,
    as photographs are."""
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(0)
    for c in range(3):
        os.makedirs(root / ("class_%d" % c))
        for i in range(12):
            w, h = (int(v) for v in rng.integers(120, 420, size=2))
            base = rng.integers(0, 256, size=(5, 5, 3), dtype=np.uint8)
            img = np.asarray(Image.fromarray(base).resize((w, h), Image.BICUBIC), np.int16)
            img = np.clip(img + rng.integers(-12, 12, size=img.shape), 0, 255).astype(np.uint8)
            ext = ".png" if i == 5 else ".jpg"
            Image.fromarray(img).save(root / ("class_%d" % c) / ("img_%02d%s" % (i, ext)))
    return str(root)


def spec(root, **kw):
    return "imagefolder:" + ",".join(["root=%s" % root] + ["%s=%s" % kv for kv in kw.items()])


def items(ld):
    """{index: (image bytes, label)} over one epoch of an unshuffled loader."""
    out, i = {}, 0
    for b in ld:
        for k in range(len(b["label"])):
            out[i] = (np.asarray(b["image"][k]).tobytes(), int(b["label"][k]))
            i += 1
    return out


def test_listing_and_labels_are_torchvision_imagefolders(folder):
    ref = ImageFolder(folder)
    with ferry.Loader(spec(folder, size=8), batch_size=7, workers=1, seed=0,
                      shuffle=False) as ld:
        assert ld.num_items == len(ref)
        labels = [y for _, y in items(ld).values()]
    assert labels == [y for _, y in ref.samples]


def test_pixels_match_torchvisions_for_the_same_crop_box(folder):
    """Given the box ferry drew (box=1), torchvision's resized_crop + hflip
    on the PIL image gives the same pixels up to resampling's rounding:
    ferry filters vertically first with 14-bit weights, PIL horizontally
    first with 22-bit ones, and a JPEG may be decoded at a reduced DCT
    scale. Measured here (64 px items, 36 files): mean |difference| 0.15
    of 255, max 1 with dct=0; 0.28, max 5 with DCT scaling."""
    ref = ImageFolder(folder)
    for dct, mean_max, max_max in ((0, 0.4, 2), (1, 0.8, 16)):
        diffs, worst = [], 0
        with ferry.Loader(spec(folder, size=64, box=1, dct=dct), batch_size=9, workers=1,
                          shuffle=False, seed=3) as ld:
            i = 0
            for b in ld:
                for k in range(len(b["label"])):
                    t, l, h, w, flipped = (int(v) for v in b["box"][k])
                    img = Image.open(ref.samples[i][0]).convert("RGB")
                    want = F.resized_crop(img, t, l, h, w, [64, 64], antialias=True)
                    if flipped:
                        want = F.hflip(want)
                    want = np.asarray(want, np.int16).transpose(2, 0, 1)
                    d = np.abs(want - np.asarray(b["image"][k], np.int16))
                    diffs.append(d.mean())
                    worst = max(worst, int(d.max()))
                    i += 1
        print("dct=%d: mean |difference| %.3f, max %d" % (dct, np.mean(diffs), worst))
        assert np.mean(diffs) < mean_max, (dct, np.mean(diffs))
        assert worst <= max_max, (dct, worst)


def test_crop_draws_follow_torchvisions_distribution(tmp_path):
    """The boxes' area share and log aspect ratio, over 6,000 draws on
    images of three shapes, against torchvision's get_params on the same
    shapes: histograms within a few points of each other."""
    shapes = [(300, 200), (200, 310), (256, 256)]
    os.makedirs(tmp_path / "c")
    for k, (w, h) in enumerate(shapes):
        Image.new("RGB", (w, h), (k * 60, 100, 30)).save(tmp_path / "c" / ("%d.jpg" % k))
    ours = {s: [] for s in shapes}
    with ferry.Loader(spec(tmp_path, size=4, box=1), batch_size=3, workers=1, seed=11,
                      shuffle=False, epochs=2000) as ld:
        for b in ld.stream():
            for k in range(3):
                t, l, h, w, _ = (int(v) for v in b["box"][k])
                ours[shapes[k]].append((h, w))
    torch.manual_seed(0)
    for (W, H), boxes in ours.items():
        img = Image.new("RGB", (W, H))
        theirs = [RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))[2:]
                  for _ in range(len(boxes))]
        for stat, bins in ((lambda h, w: h * w / (W * H), np.linspace(0, 1, 11)),
                           (lambda h, w: np.log(w / h), np.linspace(-0.3, 0.3, 7))):
            a = np.histogram([stat(h, w) for h, w in boxes], bins)[0] / len(boxes)
            b = np.histogram([stat(h, w) for h, w in theirs], bins)[0] / len(theirs)
            assert np.abs(a - b).max() < 0.03, ((W, H), a, b)


def test_same_bytes_whatever_the_workers_and_after_a_resume(folder):
    opts = dict(batch_size=5, shuffle=True, seed=7)
    runs = []
    for workers in (1, 2, 3):
        with ferry.Loader(spec(folder, size=32), workers=workers, **opts) as ld:
            runs.append([np.asarray(b["image"]).tobytes() for _ in range(2) for b in ld])
    assert runs[0] == runs[1] == runs[2]
    assert runs[0][0] != runs[0][len(runs[0]) // 2]  # epochs differ
    with ferry.Loader(spec(folder, size=32), workers=2, **opts) as ld:
        it = iter(ld)
        for _ in range(3):
            next(it)
        state = ld.state_dict()
    with ferry.Loader(spec(folder, size=32), workers=3, state=state, **opts) as ld:
        rest = [np.asarray(b["image"]).tobytes() for b in ld]
    assert rest == runs[0][3:len(rest) + 3]


def test_float32_is_totensor_then_normalize(folder):
    """dtype=float32 with mean and std: exactly torchvision's ToTensor then
    Normalize of the uint8 item."""
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    norm = spec(folder, size=16, dtype="float32", mean="%g:%g:%g" % mean, std="%g:%g:%g" % std)
    opts = dict(batch_size=4, workers=1, seed=1, shuffle=False)
    with ferry.Loader(spec(folder, size=16), **opts) as a, ferry.Loader(norm, **opts) as b:
        u8, f32 = next(iter(a))["image"], next(iter(b))["image"]
    want = F.normalize(torch.from_numpy(np.asarray(u8)).float().div(255), mean, std)
    assert torch.equal(torch.from_numpy(np.asarray(f32)), want)


def test_a_bad_file_fails_only_its_batch_naming_the_file(folder, tmp_path):
    root = tmp_path / "bad"
    os.makedirs(root / "c")
    for i in range(4):
        Image.new("RGB", (40, 30), (i * 50, 0, 0)).save(root / "c" / ("%d.jpg" % i))
    with open(root / "c" / "2.jpg", "wb") as f:
        f.write(b"<html>not an image</html>")
    with ferry.Loader(spec(root, size=8), batch_size=2, workers=1, seed=0, shuffle=False) as ld:
        it = iter(ld)
        assert len(next(it)["label"]) == 2
        with pytest.raises(ferry.BatchError) as e:
            next(it)
        assert "2.jpg" in str(e.value) and "not a JPEG or PNG file" in str(e.value)
    with ferry.Loader(spec(root, size=8, on_error="skip"), batch_size=2, workers=1,
                      seed=0) as ld:
        assert sum(len(b["label"]) for b in ld) == 4


# ------------------------------------------- ferry.torch: torchvision in C

def test_torch_imagefolder_with_a_known_compose_runs_in_c(folder, caplog):
    """An unchanged torchvision script: ImageFolder + the ImageNet training
    Compose through ferry.torch.DataLoader runs in C, says so once at info
    level, and yields what torch's DataLoader yields: [float32 (B, 3, S, S)
    normalized, int64 labels], the labels in torchvision's order."""
    import logging
    from torchvision import transforms as T

    from ferry.torch import DataLoader
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    tf = T.Compose([T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(mean, std)])
    ds = ImageFolder(folder, transform=tf)
    with caplog.at_level(logging.INFO, logger="ferry"):
        dl = DataLoader(ds, batch_size=5, num_workers=2)
    try:
        assert dl._native is not None
        assert sum("runs in C" in r.getMessage() for r in caplog.records) == 1
        batches = list(dl)
        x, y = batches[0]
        assert isinstance(x, torch.Tensor) and x.dtype == torch.float32
        assert x.shape == (5, 3, 48, 48) and y.dtype == torch.int64
        assert torch.cat([b[1] for b in batches]).tolist() == [t for _, t in ds.samples]
        # Normalized floats of uint8 pixels: x * std + mean is k / 255.
        k = (x * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]) * 255
        assert torch.allclose(k, k.round(), atol=1e-3) and k.min() >= -1e-3 and k.max() < 255.01
    finally:
        dl.close()


def test_torch_imagefolder_eval_transform_and_uint8_run_in_c(folder):
    """Resize + CenterCrop + PILToTensor: uint8, the same pixels as the C
    kind's crop=center (and within resampling's rounding of torchvision's)."""
    from torchvision import transforms as T

    from ferry.torch import DataLoader
    tf = T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()])
    ds = ImageFolder(folder, transform=tf)
    dl = DataLoader(ds, batch_size=6, num_workers=1)
    try:
        assert dl._native is not None and "crop=center" in dl._native
        x, _ = next(iter(dl))
        assert x.dtype == torch.uint8 and x.shape == (6, 3, 32, 32)
        want = torch.stack([ds[i][0] for i in range(6)])
        diff = (x.int() - want.int()).abs().float()
        assert diff.mean() < 0.6 and diff.max() <= 16, (diff.mean(), diff.max())
    finally:
        dl.close()


@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    """JPEGs of 360-700 px with sharp edges (rectangles, thin lines), where
    decoding at a reduced DCT scale differs most from a full decode."""
    from PIL import ImageDraw
    root = tmp_path_factory.mktemp("sharp")
    rng = np.random.default_rng(1)
    os.makedirs(root / "c")
    for i in range(8):
        w, h = (int(v) for v in rng.integers(360, 700, size=2))
        img = Image.new("RGB", (w, h), tuple(int(v) for v in rng.integers(0, 256, 3)))
        d = ImageDraw.Draw(img)
        for _ in range(60):
            x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
            x1, y1 = x0 + int(rng.integers(2, 120)), y0 + int(rng.integers(2, 120))
            col = tuple(int(v) for v in rng.integers(0, 256, 3))
            if rng.random() < 0.5:
                d.rectangle([x0, y0, x1, y1], fill=col)
            else:
                d.line([x0, y0, x1, y1], fill=col, width=int(rng.integers(1, 4)))
        img.save(root / "c" / ("%02d.jpg" % i), quality=92)
    return str(root)


def test_torch_imagefolder_in_c_gives_torchvisions_pixels_on_sharp_edges(sharp):
    """Through ferry.torch the C path decodes JPEGs at full scale: on
    sharp-edged images its pixels are torchvision's within 1 of 255 (at a
    reduced DCT scale, asked for with dct=1, up to ~60 differ); dct is a
    keyword of ferry.torch.DataLoader (it was refused as an unknown
    option), 0 or 1."""
    from torchvision import transforms as T

    from ferry.torch import DataLoader
    tf = T.Compose([T.Resize(160), T.CenterCrop(128), T.PILToTensor()])
    ds = ImageFolder(sharp, transform=tf)
    want = torch.stack([ds[i][0] for i in range(len(ds))]).int()
    worst = {}
    for dct in (0, 1):
        with DataLoader(ds, batch_size=4, num_workers=1, dct=dct) as dl:
            assert dl._native is not None and ("dct=%d" % dct) in dl._native
            got = torch.cat([x for x, _ in dl]).int()
        worst[dct] = int((got - want).abs().max())
    print("max |difference| from torchvision: dct=0 %d, dct=1 %d" % (worst[0], worst[1]))
    assert worst[0] <= 1 and worst[1] >= worst[0]
    with pytest.raises(ValueError, match="dct must be 0"):
        DataLoader(ds, batch_size=4, num_workers=1, dct=2)


@pytest.mark.parametrize("why", ["jitter", "target_transform", "native_false", "collate"])
def test_torch_imagefolder_falls_back_to_python(folder, why, caplog):
    """Anything ferry does not run in C (another transform, a
    target_transform, a collate_fn) or native=False runs torchvision's code
    in Python workers, as it is, and says why."""
    import logging
    from torchvision import transforms as T

    from ferry.torch import DataLoader
    steps = [T.RandomResizedCrop(16), T.ToTensor()]
    if why == "jitter":
        steps.insert(1, T.ColorJitter(0.2))
    ds = ImageFolder(folder, transform=T.Compose(steps),
                     target_transform=(lambda t: t + 100) if why == "target_transform" else None)
    kw = {"native": False} if why == "native_false" else {}
    if why == "collate":
        kw["collate_fn"] = torch.utils.data.default_collate
    with caplog.at_level(logging.INFO, logger="ferry"):
        dl = DataLoader(ds, batch_size=4, num_workers=1, **kw)
    try:
        assert dl._native is None
        if why in ("jitter", "target_transform"):
            assert any("runs in Python" in r.getMessage() for r in caplog.records)
        x, y = next(iter(dl))
        assert x.shape == (4, 3, 16, 16) and x.dtype == torch.float32
        if why == "target_transform":
            assert int(y.min()) >= 100
    finally:
        dl.close()


class _WithIndex(ImageFolder):
    """A subclass whose __getitem__ adds the index: torchvision's code as a
    user extends it, which C cannot know."""

    def __getitem__(self, index):
        x, y = super().__getitem__(index)
        return x, y, index


class _Refuses(ImageFolder):
    def __getitem__(self, index):
        raise ValueError("this subclass refuses item %d" % index)


def _torch_batches(ds, **kw):
    return list(torch.utils.data.DataLoader(ds, num_workers=0, **kw))


@pytest.mark.parametrize("how", ["subclass", "subclass_raises", "labels_remapped",
                                 "compose_subclass"])
def test_torch_imagefolder_never_replaces_code_c_does_not_reproduce(folder, how, caplog):
    """The C path stands in only for torchvision's own ImageFolder and
    Compose: a subclass's __getitem__ (an extra index, a raise), labels
    remapped in ``samples`` (an order-keeping remap: x2) or a Compose
    subclass run the user's code in Python workers, give what torch's
    DataLoader gives on the same data, and say why on stderr without any
    logging set up (at warning level). They used to be replaced by the C kind silently."""
    from torchvision import transforms as T

    from ferry.torch import DataLoader
    steps = [T.Resize(20), T.CenterCrop(16), T.PILToTensor()]
    tf = T.Compose(steps)
    if how == "compose_subclass":
        class Compose2(T.Compose):
            def __call__(self, img):
                return super().__call__(img) // 2
        tf = Compose2(steps)
    cls = {"subclass": _WithIndex, "subclass_raises": _Refuses}.get(how, ImageFolder)
    ds = cls(folder, transform=tf)
    if how == "labels_remapped":
        ds.samples = [(p, 2 * y) for p, y in ds.samples]
    dl = DataLoader(ds, batch_size=6, num_workers=1)
    try:
        assert dl._native is None
        if how != "compose_subclass":  # said once per reason and process
            assert any("runs in Python" in r.getMessage() for r in caplog.records)
        if how == "subclass_raises":
            with pytest.raises(ValueError, match="this subclass refuses item"):
                next(iter(dl))
            return
        got, want = list(dl), _torch_batches(ds, batch_size=6)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert len(g) == len(w)
            for a, b in zip(g, w):
                assert torch.equal(a, b)
        if how == "subclass":
            assert torch.cat([b[2] for b in got]).tolist() == list(range(len(ds)))
    finally:
        dl.close()


def test_the_c_path_notice_reaches_stderr_without_logging(folder):
    """A script that configured no logging still sees, once, that its
    pipeline runs in C (the notice used to be at info level: invisible)."""
    import subprocess
    import sys
    script = (
        "import sys\n"
        "from torchvision import transforms as T\n"
        "from torchvision.datasets import ImageFolder\n"
        "from ferry.torch import DataLoader\n"
        "tf = T.Compose([T.Resize(22), T.CenterCrop(14), T.PILToTensor()])\n"
        "for _ in range(2):\n"
        "    DataLoader(ImageFolder(sys.argv[1], transform=tf), batch_size=4,\n"
        "               num_workers=1).close()\n")
    r = subprocess.run([sys.executable, "-c", script, folder], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("runs in C") == 1, r.stderr


# ------------------------------------------------------ WebDataset shards

def write_shards(folder, out, per_shard, member=None):
    """The folder's images as WebDataset shards in ImageFolder's order:
    KEY.jpg (or .png) and KEY.cls, `per_shard` samples a shard, names
    out/shard-000000.tar... ; `member(tar, key, i)` may add more members."""
    import io
    import tarfile
    samples = ImageFolder(folder).samples
    os.makedirs(out, exist_ok=True)
    for s in range(0, len(samples), per_shard):
        with tarfile.open(os.path.join(out, "shard-%06d.tar" % (s // per_shard)), "w",
                          format=tarfile.USTAR_FORMAT if s == 0 else tarfile.GNU_FORMAT) as t:
            for i, (path, label) in enumerate(samples[s:s + per_shard], s):
                key = "sub/%06d" % i if i % 2 else "%06d" % i
                for ext, data in ((os.path.splitext(path)[1][1:], open(path, "rb").read()),
                                  ("cls", b"%d\n" % label)):
                    info = tarfile.TarInfo("%s.%s" % (key, ext))
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
                if member:
                    member(t, key, i)
    return (len(samples) + per_shard - 1) // per_shard


def test_wds_shards_give_imagefolders_items_byte_for_byte(folder, tmp_path):
    """The same images in tar shards (a brace pattern, two tar formats) are
    the same items: wds item i is imagefolder item i, the same bytes for the
    same (seed, epoch, index), with the label from .cls."""
    n = write_shards(folder, tmp_path, 10)
    pattern = str(tmp_path / ("shard-{000000..%06d}.tar" % (n - 1)))
    opts = dict(batch_size=6, workers=2, seed=5, shuffle=True)
    with ferry.Loader(spec(folder, size=24), **opts) as a:
        want = [(np.asarray(b["image"]).tobytes(), np.asarray(b["label"]).tolist()) for b in a]
    with ferry.Loader("wds:shards=%s,size=24" % pattern, **opts) as b:
        assert b.num_items == 36
        got = [(np.asarray(x["image"]).tobytes(), np.asarray(x["label"]).tolist()) for x in b]
    assert got == want
    # Two patterns separated by ';', and a relative path made absolute.
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        first, rest = "shard-000000.tar", "shard-{000001..%06d}.tar" % (n - 1)
        with ferry.Loader("wds:shards=%s;%s,size=24" % (first, rest), **opts) as c:
            assert [np.asarray(x["image"]).tobytes() for x in c] == [w[0] for w in want]
    finally:
        os.chdir(here)


def test_wds_bad_shards_are_refused_naming_the_shard(tmp_path, folder):
    write_shards(folder, tmp_path / "good", 36)
    good = (tmp_path / "good" / "shard-000000.tar").read_bytes()
    cases = {
        "truncated.tar": (good[:len(good) // 2], "truncated"),
        "html.tar": (b"<!DOCTYPE html>" + bytes(600), "bad header checksum"),
        "empty.tar": (b"", "hold no samples"),
    }
    for name, (data, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ferry.DatasetError) as e:
            ferry.Loader("wds:shards=%s" % (tmp_path / name), batch_size=2, workers=1)
        assert words in str(e.value) and name in str(e.value), str(e.value)
    for spec_text, words in (("wds:size=8", "shards=PATTERN is required"),
                             ("wds:shards=%s/x-{a..b}.tar" % tmp_path, "{A..B} with integers"),
                             ("wds:shards=%s/missing.tar" % tmp_path, "No such file")):
        with pytest.raises(ferry.DatasetError) as e:
            ferry.Loader(spec_text, batch_size=2, workers=1)
        assert words in str(e.value), str(e.value)


def test_wds_a_sample_without_image_or_with_a_bad_label_is_refused(tmp_path, folder):
    import io
    import tarfile

    def extra(t, key, i):
        if i == 3:
            data = b"three"
            info = tarfile.TarInfo("%s.cls" % key)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    write_shards(folder, tmp_path / "a", 36, member=extra)
    with pytest.raises(ferry.DatasetError) as e:
        ferry.Loader("wds:shards=%s" % (tmp_path / "a" / "shard-000000.tar"), batch_size=2,
                     workers=1)
    assert "is not a decimal integer" in str(e.value)
    with tarfile.open(tmp_path / "b.tar", "w") as t:
        info = tarfile.TarInfo("000001.json")
        info.size = 2
        t.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(ferry.DatasetError) as e:
        ferry.Loader("wds:shards=%s" % (tmp_path / "b.tar"), batch_size=2, workers=1)
    assert "sample '000001' has no image" in str(e.value)


def test_wds_a_corrupt_image_fails_only_its_batch(tmp_path, folder):
    write_shards(folder, tmp_path, 36)
    shard = tmp_path / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    at = data.find(b"\xff\xd8\xff", data.find(b"000004.jpg"))
    data[at:at + 3] = b"XYZ"  # item 4's JPEG no longer starts as one
    shard.write_bytes(bytes(data))
    with ferry.Loader("wds:shards=%s,size=8" % shard, batch_size=4, workers=1,
                      shuffle=False) as ld:
        it = iter(ld)
        assert len(next(it)["label"]) == 4
        with pytest.raises(ferry.BatchError) as e:
            next(it)
        assert "shard-000000.tar:000004" in str(e.value) and "not a JPEG" in str(e.value)
        assert len(next(it)["label"]) == 4


def test_wds_order_shards_reads_near_sequentially_and_resumes_exactly(folder, tmp_path):
    """order=shards: each epoch every sample once, the shards in an order of
    their own per epoch and the samples shuffled only within windows, so a
    run of positions stays in one shard; the same with 1 and 3 workers, and
    exact after a resume."""
    n = write_shards(folder, tmp_path, 6)  # 6 shards of 6
    pattern = str(tmp_path / ("shard-{000000..%06d}.tar" % (n - 1)))
    base = dict(batch_size=4, shuffle=False, seed=3)
    with ferry.Loader("wds:shards=%s,size=8,crop=center" % pattern, workers=1, **base) as ld:
        ordered = [np.asarray(img).tobytes() for b in ld for img in b["image"]]
    assert len(set(ordered)) == 36  # the images tell the samples apart
    sample_of = {img: i for i, img in enumerate(ordered)}
    spec_text = "wds:shards=%s,size=8,crop=center,order=shards,window=4" % pattern

    def epochs(ld, k):
        return [[sample_of[np.asarray(img).tobytes()] for b in ld for img in b["image"]]
                for _ in range(k)]
    with ferry.Loader(spec_text, workers=1, **base) as ld:
        one = epochs(ld, 2)
    with ferry.Loader(spec_text, workers=3, **base) as ld:
        three = epochs(ld, 2)
    assert one == three
    for order in one:
        assert sorted(order) == list(range(36))
        switches = sum(1 for a, b in zip(order, order[1:]) if a // 6 != b // 6)
        assert switches <= 6 + 36 // 4, order  # runs within a shard, not random reads
    assert one[0] != one[1] and one[0] != list(range(36))
    with ferry.Loader(spec_text, workers=2, **base) as ld:
        it = iter(ld)
        for _ in range(4):
            next(it)
        state = ld.state_dict()
    with ferry.Loader(spec_text, workers=2, state=state, **base) as ld:
        rest = [sample_of[np.asarray(img).tobytes()] for b in ld for img in b["image"]]
    assert rest == one[0][16:]
