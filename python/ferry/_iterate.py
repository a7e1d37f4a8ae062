"""The iterators a ferry.Loader gives: one epoch's batches (``for batch in
loader``), and every batch to the stream's end (``loader.stream()``);
classes, not generators, so that a failed batch raised out of one leaves
it usable."""

from ._errors import BatchError


class _Epoch:
    """The iterator one ``for batch in loader`` gets: batches until the
    end of the current epoch. In order, that is the batch marked
    last_in_epoch (or a failure in its place); out of order
    (``in_order=False``), it is the epoch's len(loader) batches in the order
    they come: one of the next epoch that is made meanwhile (prefetch runs
    on) waits in the C loader's window for the next ``for``."""

    __slots__ = ("_loader", "_done", "_timeout")

    def __init__(self, loader, timeout=None):
        self._loader = loader
        self._done = False
        self._timeout = timeout  # seconds for each batch (ferry.NotReady past it)

    def __iter__(self):
        return self

    def _count(self, last):
        ld = self._loader
        if ld._in_order:
            ld._seen = 0
            self._done = bool(last)
            return
        ld._seen += 1
        if ld._seen >= ld._len[1]:
            ld._seen = 0
            self._done = True

    def _next_out_of_order(self):
        """The next batch (or failure) of this epoch, out of order. The C
        loader hands out no batch of a later epoch before the current one
        is whole (it keeps them in its window meanwhile), and marks the
        epoch's last one handed out."""
        ld = self._loader
        try:
            item = ld._next(self._timeout)
        except BatchError as e:
            item = e
        if item is None:  # the end of the stream
            self._done = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._count(False)
            raise item
        # The C loader marks the epoch's last batch handed out; a failure
        # carries no mark, so failures are counted toward len(loader).
        if item._b.last_in_epoch:
            ld._seen = 0
            self._done = True
        else:
            self._count(False)
        return item

    def __next__(self):
        if self._done:
            raise StopIteration
        ld = self._loader
        if not ld._in_order:
            return self._next_out_of_order()
        try:
            b = ld._next(self._timeout)
        except BatchError as e:
            last = e.batch_in_epoch is not None and e.batch_in_epoch + 1 >= len(ld)
            self._count(last)
            raise
        if b is None:
            self._done = True
            raise StopIteration
        # _count inlined, reading the C batch's flag: between next()
        # returning and the batch reaching the for loop, no Python function
        # may be called, since a signal handler runs at a call and the
        # KeyboardInterrupt it raises would drop a batch ferry has counted.
        ld._seen = 0
        self._done = b._b.last_in_epoch
        return b


class _Stream:
    """The iterator :meth:`Loader.stream` returns: every batch to the end of
    the stream. A class, not a generator, so that a BatchError raised out of
    it leaves it usable: iteration goes on with the next batch."""

    __slots__ = ("_loader", "_done")

    def __init__(self, loader):
        self._loader = loader
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        b = self._loader._next(None)
        if b is None:
            self._done = True
            raise StopIteration
        return b
