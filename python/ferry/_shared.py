"""Big collections of Python objects, shared with the workers in compact form.

A list of a million dicts or a vocabulary of a million words costs each
forked worker a copy of its own as the worker reads it: reading an object
writes its reference count, and the page it lies on is then copied. This
is why torch's workers grow through an epoch. ferry encodes such a
collection once, as it pickles the dataset for the workers, into a few
numpy arrays (columns); their bytes go out of band into the memory every
worker maps (see _handoff.py), and an item is decoded from
them when it is read. The workers' pages stay shared whatever they read.

What is encoded (automatically, for a ``list`` or ``dict`` of at least
:data:`AUTO_MIN` items, never a subclass of them):

- a list whose items are all plain values (str, bytes, int, float, bool,
  None, or tuples of them), or all dicts with the same keys in the same
  order whose values are plain values;
- a dict whose keys are all str, all bytes or all int, and whose values
  are plain values.

In a worker these read like the original: indexing, slicing, ``len``,
iteration, ``in``, ``==``, ``.index``/``.count``; ``.get``, ``.keys``,
``.items``, ``.values`` for the dict. An item is the same value; a dict
item is a new dict equal to the original at each read, so a worker's
change to one does not last to its next read. (With torch's workers such a
change lasts in the one worker that made it, which is a result that
depends on which worker was given which index.) A change to the
collection itself (append, assignment, sort) makes that worker's own copy
as a plain list or dict, said once in the log, and goes on exactly as it
would with torch. What no encoding keeps is ``type(x) is list`` (the
object is a :class:`SharedList`, a ``collections.abc.Sequence``; the dict
a :class:`SharedDict`, a ``Mapping``): ``ferry.Loader(...,
share_collections=False)`` turns all of this off.

:func:`shared` encodes any list or dict of picklable items on request,
nested and mutable ones included (each read unpickles its item anew).
"""

import collections.abc
import numbers
import pickle
import zlib

import numpy as np

from . import _ferry

AUTO_MIN = 100_000  # items: below this, a copy per worker costs little

_PLAIN = (str, bytes, int, float, bool, type(None))


def _plain(x):
    t = type(x)
    if t in _PLAIN:
        return True
    return t is tuple and all(_plain(v) for v in x)


# ------------------------------------------------------------ columns
#
# A column is n values of one kind, decoded by index:
#   ("str", blob u8, ends i64)   utf-8 (surrogates kept) end to end
#   ("bytes", blob, ends)
#   ("int", i64), ("float", f64), ("bool", u1), ("none",)
#   ("pickle", blob, ends)       anything else, one pickle per value

def _ends(lengths):
    ends = np.empty(len(lengths) + 1, dtype=np.int64)
    ends[0] = 0
    np.cumsum(np.fromiter(lengths, dtype=np.int64, count=len(lengths)), out=ends[1:])
    return ends


def _text_column(values):
    """A column of strs that are not all ASCII (those are packed in C:
    encode_column): UTF-8, surrogates kept."""
    raw = [v.encode("utf-8", "surrogatepass") for v in values]
    return ("str", np.frombuffer(b"".join(raw), dtype=np.uint8), _ends(list(map(len, raw))))


def _pickle_column(values):
    raw = [pickle.dumps(v, protocol=5) for v in values]
    return ("pickle", np.frombuffer(b"".join(raw), dtype=np.uint8), _ends(list(map(len, raw))))


def _packed(col):
    """A column packed in C (columns.c: col_result) as encode_column makes
    it: numpy arrays over the bytes."""
    if col[0] == "str":
        return ("str", np.frombuffer(col[1], dtype=np.uint8), np.frombuffer(col[2], dtype=np.int64))
    return (col[0], np.frombuffer(col[1], dtype=np.int64 if col[0] == "int" else np.float64))


def encode_column(values, plain=False):
    """values (a list) as a column; with plain, None unless every value is
    a plain one (see _plain)."""
    if values and type(values[0]) is str:  # the common column: checked in C
        packed = _ferry.str_column(values)
        if packed is not None:
            return _packed(("str",) + packed)
    if values and type(values[0]) is int:  # the other common one
        packed = _ferry.int_column(values)
        if packed is not None:
            return _packed(("int", packed))
    kinds = set(map(type, values))
    if plain and not _plain_list(values, kinds):
        return None
    if kinds == {str}:
        return _text_column(values)
    if kinds == {bytes}:
        return ("bytes", np.frombuffer(b"".join(values), dtype=np.uint8),
                _ends(list(map(len, values))))
    if kinds == {int}:
        try:
            return ("int", np.array(values, dtype=np.int64))
        except OverflowError:
            return _pickle_column(values)
    if kinds == {float}:
        return ("float", np.array(values, dtype=np.float64))
    if kinds == {bool}:
        return ("bool", np.array(values, dtype=np.uint8))
    if kinds == {type(None)}:
        return ("none", len(values))
    return _pickle_column(values)


class _Column:
    """A column's values by index, read from its arrays (no copy)."""

    __slots__ = ("kind", "at")

    def __init__(self, col):
        self.kind = col[0]
        if self.kind in ("str", "bytes", "pickle"):
            blob, ends = col[1], col[2]
            # memoryviews: indexing one gives a Python int, 10x faster than numpy's
            blob_view = memoryview(np.ascontiguousarray(blob)).cast("B")
            end_view = memoryview(np.ascontiguousarray(ends, dtype=np.int64)).cast("B").cast("q")
            if self.kind == "str":
                self.at = lambda i: str(blob_view[end_view[i]:end_view[i + 1]], "utf-8",
                                        "surrogatepass")
            elif self.kind == "bytes":
                self.at = lambda i: bytes(blob_view[end_view[i]:end_view[i + 1]])
            else:
                self.at = lambda i: pickle.loads(blob_view[end_view[i]:end_view[i + 1]])
        elif self.kind == "int":
            view = memoryview(np.ascontiguousarray(col[1], dtype=np.int64)).cast("B").cast("q")
            self.at = view.__getitem__
        elif self.kind == "float":
            view = memoryview(np.ascontiguousarray(col[1], dtype=np.float64)).cast("B").cast("d")
            self.at = view.__getitem__
        elif self.kind == "bool":
            arr = col[1]
            self.at = lambda i: bool(arr[i])
        elif self.kind == "none":
            self.at = lambda i: None
        else:
            raise ValueError("ferry: a shared collection's column of unknown kind %r" % (self.kind,))


# ------------------------------------------------------------ rows
#
# A list's items: ("value", column) one value each; ("tuple", [columns]);
# ("dict", keys, [columns]) dicts with the same keys in one order.

def _encode_rows(items, auto):
    """The rows of list ``items``, or None when ``auto`` and its items are
    not ones whose reads can be kept exact (see the file's top)."""
    if items and type(items[0]) is dict:
        # dicts alike: the first one's keys, in its order, in every one (C)
        keys = tuple(items[0])
        # the common case in one pass: fields of ASCII str, int, float
        cols = _ferry.records_encode(items, keys)
        if cols is not None:
            return ("dict", list(keys), [_packed(c) for c in cols])
        cols = _ferry.dict_columns(items, keys)
        if cols is not None:
            encoded = [encode_column(c, plain=auto) for c in cols]
            if None not in encoded:
                return ("dict", list(keys), encoded)
    if items and type(items[0]) is tuple:
        # the common case in one pass: places of ASCII str, int, float
        # (an ImageFolder's samples, (path, class index))
        cols = _ferry.tuples_encode(items, len(items[0]))
        if cols is not None:
            return ("tuple", [_packed(c) for c in cols])
        cols = _ferry.tuple_columns(items, len(items[0]))  # tuples alike (C)
        if cols is not None:
            encoded = [encode_column(c, plain=True) for c in cols]
            if None not in encoded:
                return ("tuple", encoded)
    if items and type(items[0]) in (str, int, float):
        # all of the first's kind (ASCII str, 64-bit int, float) in one pass
        cols = _ferry.values_encode(items)
        if cols is not None:
            return ("value", _packed(cols[0]))
    kinds = set(map(type, items))
    if auto and not _plain_list(items, kinds):
        return None
    return ("value", encode_column(items))


def _plain_list(values, kinds=None):
    kinds = set(map(type, values)) if kinds is None else kinds
    if kinds <= set(_PLAIN):
        return True
    return all(_plain(v) for v in values)


class _Rows:
    """Decodes item i of a list's rows."""

    def __init__(self, rows):
        kind = rows[0]
        if kind == "value":
            self.at = _Column(rows[1]).at
        elif kind == "tuple":
            cols = [_Column(c).at for c in rows[1]]
            self.at = lambda i: tuple([c(i) for c in cols])
        elif kind == "dict":
            pairs = [(k, _Column(c).at) for k, c in zip(rows[1], rows[2])]
            self.at = lambda i: {k: c(i) for k, c in pairs}
        else:
            raise ValueError("ferry: a shared list's rows of unknown kind %r" % (kind,))


def _said_once(what, n):
    """A worker's change to a shared collection, said once per collection."""
    import logging
    logging.getLogger("ferry").info(
        "ferry: this worker changed the dataset's shared %s of %d items: it now holds a copy "
        "of its own (in a worker, as with torch's, the change stays in this worker)", what, n)


class _Local:
    """The mixin that turns a shared collection into a plain local one the
    first time something changes it."""

    __slots__ = ()

    def _own(self):
        if self._local is None:
            self._local = self._materialize()
            _said_once(self._noun, len(self._local))
        return self._local


def _mutator(name):
    def call(self, *args, **kwargs):
        return getattr(self._own(), name)(*args, **kwargs)
    call.__name__ = name
    return call


class SharedList(_Local, collections.abc.Sequence):
    """A list encoded once into shared memory (see the file's top)."""

    __slots__ = ("_n", "_rows", "_state", "_local", "__weakref__")
    _noun = "list"

    def __init__(self, state):
        self._state = state
        self._n = state[0]
        self._rows = _Rows(state[1]).at
        self._local = None

    def __reduce__(self):
        if self._local is not None:
            return (list, (self._local,))
        return (SharedList, (self._state,))

    def __len__(self):
        return self._n if self._local is None else len(self._local)

    def __getitem__(self, i):
        if self._local is not None:
            return self._local[i]
        if isinstance(i, slice):
            return [self._rows(k) for k in range(*i.indices(self._n))]
        try:
            k = i.__index__()
        except AttributeError:
            raise TypeError("list indices must be integers or slices, not %s"
                            % type(i).__name__) from None
        if k < 0:
            k += self._n
        if not 0 <= k < self._n:
            raise IndexError("list index out of range")
        return self._rows(k)

    def __iter__(self):
        if self._local is not None:
            return iter(self._local)
        return map(self._rows, range(self._n))

    def _materialize(self):
        return [self._rows(k) for k in range(self._n)]

    def __eq__(self, other):
        if isinstance(other, (list, SharedList)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __add__(self, other):
        if isinstance(other, (list, SharedList)):
            return list(self) + list(other)
        return NotImplemented

    def __radd__(self, other):
        if isinstance(other, list):
            return other + list(self)
        return NotImplemented

    def __mul__(self, n):
        return list(self) * n

    __rmul__ = __mul__

    def __repr__(self):
        return repr(list(self))

    def copy(self):
        return list(self)

    __copy__ = copy

    def __deepcopy__(self, memo):
        import copy
        return copy.deepcopy(list(self), memo)



for _name in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
              "__setitem__", "__delitem__", "__iadd__", "__imul__"):
    setattr(SharedList, _name, _mutator(_name))
collections.abc.MutableSequence.register(SharedList)


def _key_hash(kind, key):
    """The hash a SharedDict files key under, the same in every process
    (str's own hash is salted per interpreter). str keys packed in C are
    found in C (_ferry.str_find); these are the others."""
    if kind == "str-py":
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if kind == "bytes":
        return zlib.crc32(key)
    return key & 0x7FFFFFFFFFFFFFFF


def _str8_slots(table, n):
    """The slots of a table _ferry made for n str keys (str_dict_encode,
    str_index): 4 bytes each below 2**31 - 1 keys, else 8 (columns.c's
    table_width)."""
    return np.frombuffer(table, dtype=np.uint32 if n < 2**31 - 1 else np.uint64)


def _index(hashes):
    """An open-addressing table (linear probing) of positions: slot ->
    position + 1, 0 empty; 2 slots or more per key."""
    n = len(hashes)
    size = 1 << max(4, (2 * n).bit_length())
    mask = size - 1
    table = np.zeros(size, dtype=np.int64)
    want = np.arange(n, dtype=np.int64)
    home = hashes.astype(np.int64) & mask
    probe = np.zeros(n, dtype=np.int64)
    while len(want):
        slot = (home + probe) & mask
        free = table[slot] == 0
        # the keys whose slot this round is free
        cand = np.flatnonzero(free)
        table[slot[cand]] = want[cand] + 1  # of those who want one slot, one gets it
        won = cand[table[slot[cand]] == want[cand] + 1]
        keep = np.ones(len(want), dtype=bool)
        keep[won] = False
        want, home, probe = want[keep], home[keep], probe[keep] + 1
    return table


class SharedDict(_Local, collections.abc.Mapping):
    """A dict encoded once into shared memory (see the file's top)."""

    __slots__ = ("_n", "_state", "_local", "_key", "_value", "_kind", "_table", "_mask",
                 "_raw_key", "__weakref__")
    _noun = "dict"

    def __init__(self, state):
        n, kind, keys, values, table = state
        if kind == "str":
            # A state from before the table's hash changed (FNV-1a; now
            # columns.c's key_hash, kind "str8"): its table is built again.
            kind = "str8"
            table = _str8_slots(_ferry.str_index(keys[1], keys[2]), n)
            state = (n, kind, keys, values, table)
        self._state = state
        self._n, self._kind = n, kind
        self._key = _Column(keys).at
        self._value = _Rows(values).at
        if kind == "str8":
            # str_find's buffers, as memoryviews: the cheapest to hand to C
            self._raw_key = tuple(memoryview(np.ascontiguousarray(a)).cast("B")
                                  for a in (table, keys[1], keys[2]))
            self._table = self._mask = None
        else:
            self._raw_key = None
            self._table = memoryview(np.ascontiguousarray(table)).cast("B").cast("q")
            self._mask = len(table) - 1
        self._local = None

    def __reduce__(self):
        if self._local is not None:
            return (dict, (self._local,))
        return (SharedDict, (self._state,))

    def _find(self, key):
        """The position of key, or -1."""
        kind = self._kind
        if kind == "str8":  # the table and the search are C's (columns.c)
            if not isinstance(key, str):
                return -1
            return _ferry.str_find(*self._raw_key, key)
        if kind == "str-py":
            if not isinstance(key, str):
                return -1
        elif kind == "bytes":
            if not isinstance(key, bytes):
                return -1
        else:  # int keys: whatever number equals an int finds it, as in a dict
            if not isinstance(key, numbers.Number):
                return -1
            try:
                k = int(key)
            except (TypeError, ValueError, OverflowError):
                return -1
            if k != key:
                return -1
            key = k
        slot = _key_hash(kind, key) & self._mask
        table, at = self._table, self._key
        while True:
            pos = table[slot]
            if pos == 0:
                return -1
            if at(pos - 1) == key:
                return pos - 1
            slot = (slot + 1) & self._mask

    def __getitem__(self, key):
        if self._local is not None:
            return self._local[key]
        pos = self._find(key)
        if pos < 0:
            hash(key)  # an unhashable key: TypeError, as a dict says
            raise KeyError(key)
        return self._value(pos)

    def __contains__(self, key):
        if self._local is not None:
            return key in self._local
        pos = self._find(key)
        if pos < 0:
            hash(key)
        return pos >= 0

    def get(self, key, default=None):
        if self._local is not None:
            return self._local.get(key, default)
        pos = self._find(key)
        return default if pos < 0 else self._value(pos)

    def __len__(self):
        return self._n if self._local is None else len(self._local)

    def __iter__(self):
        if self._local is not None:
            return iter(self._local)
        return map(self._key, range(self._n))

    def _materialize(self):
        return {self._key(k): self._value(k) for k in range(self._n)}

    def __eq__(self, other):
        if isinstance(other, (dict, SharedDict)):
            return len(self) == len(other) and all(
                k in other and other[k] == v for k, v in self.items())
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __or__(self, other):
        if isinstance(other, collections.abc.Mapping):
            return {**self, **other}
        return NotImplemented

    def __ror__(self, other):
        if isinstance(other, collections.abc.Mapping):
            return {**other, **self}
        return NotImplemented

    def __repr__(self):
        return repr(dict(self.items()))

    def copy(self):
        return dict(self.items())

    __copy__ = copy

    def __deepcopy__(self, memo):
        import copy
        return copy.deepcopy(dict(self.items()), memo)

    def items(self):
        return _Items(self)

    def values(self):
        return _Values(self)


class _Items(collections.abc.ItemsView):
    def __iter__(self):
        d = self._mapping
        if d._local is not None:
            return iter(d._local.items())
        return ((d._key(k), d._value(k)) for k in range(d._n))


class _Values(collections.abc.ValuesView):
    def __iter__(self):
        d = self._mapping
        if d._local is not None:
            return iter(d._local.values())
        return map(d._value, range(d._n))


for _name in ("__setitem__", "__delitem__", "pop", "popitem", "clear", "update", "setdefault",
              "__ior__"):
    setattr(SharedDict, _name, _mutator(_name))
del _name
collections.abc.MutableMapping.register(SharedDict)


# ------------------------------------------------------------ encoding

def encode_list(items, auto=True):
    """A SharedList's state for list ``items``, or None (see _encode_rows)."""
    rows = _encode_rows(items, auto)
    return None if rows is None else (len(items), rows)


def encode_dict(d, auto=True):
    """A SharedDict's state for dict ``d``, or None when its keys are not
    all str, all bytes or all int (or, ``auto``, its values not plain)."""
    one = _ferry.str_dict_encode(d) if type(d) is dict else None  # ASCII str keys: one pass
    if one is not None:
        blob, ends, table, values = one
        rows = ("value", _packed(values)) if values is not None else \
            _encode_rows(list(d.values()), auto)
        if rows is None:
            return None
        key_col = _packed(("str", blob, ends))
        n = len(key_col[2]) - 1
        return (n, "str8", key_col, rows, _str8_slots(table, n))
    keys = list(d)
    packed = _ferry.str_column(keys)  # all str (checked in C): the common case
    if packed is not None:
        kind = "str8"
    else:
        kinds = set(map(type, keys))
        if kinds == {str}:
            kind = "str-py"  # a lone surrogate: its UTF-8 is Python's own (surrogatepass)
        elif kinds == {bytes}:
            kind = "bytes"
        elif kinds == {int}:
            kind = "int"
        else:
            return None
    rows = _encode_rows(list(d.values()), auto)
    if rows is None:
        return None
    if kind == "str8":  # the table in C, found in C
        key_col = _packed(("str",) + packed)
        table = _str8_slots(_ferry.str_index(packed[0], packed[1]), len(keys))
        return (len(keys), kind, key_col, rows, table)
    key_col = encode_column(keys)
    if kind == "int" and key_col[0] != "int":
        return None  # beyond 64 bits
    if kind == "int":
        hashes = key_col[1] & 0x7FFFFFFFFFFFFFFF
    else:
        hashes = np.fromiter((_key_hash(kind, k) for k in keys), dtype=np.int64,
                             count=len(keys))
    return (len(keys), kind, key_col, rows, _index(hashes))


def auto_encode(obj):
    """The persistent id the handoff pickles a list or dict as, to share it
    in compact form, or None: see the file's top for which. (A pickler's
    reducer_override is never asked about a list or a dict; its
    persistent_id is.)"""
    t = type(obj)
    if t is list:
        state = encode_list(obj)
        return None if state is None else ("ferry.shared", "list", state)
    if t is dict:
        state = encode_dict(obj)
        return None if state is None else ("ferry.shared", "dict", state)
    return None


class Decoder:
    """An unpickler's persistent_load for auto_encode's ids: the
    SharedList or SharedDict of each, one object per id (a list the
    dataset held twice is one object in the worker too)."""

    def __init__(self):
        self._made = {}  # id(pid) -> (pid, object): the pickle's memo gives one pid once

    def __call__(self, pid):
        made = self._made.get(id(pid))
        if made is not None:
            return made[1]
        if not (isinstance(pid, tuple) and len(pid) == 3 and pid[0] == "ferry.shared"):
            raise pickle.UnpicklingError("ferry: the dataset's pickle names an unknown "
                                         "persistent object")
        obj = SharedList(pid[2]) if pid[1] == "list" else SharedDict(pid[2])
        self._made[id(pid)] = (pid, obj)
        return obj


def shared(obj):
    """obj (a list or dict) encoded for the workers now, whatever its size
    or items: each read decodes (for a mutable item, unpickles) it anew, so
    a change a worker makes to an item it read does not last. The trainer
    gets the SharedList or SharedDict to hold in its dataset; a dict's keys
    must be all str, all bytes or all int."""
    if isinstance(obj, (SharedList, SharedDict)):
        return obj
    if isinstance(obj, list):
        return SharedList(encode_list(list(obj), auto=False))
    if isinstance(obj, dict):
        state = encode_dict(obj, auto=False)
        if state is None:
            raise TypeError("ferry.shared: a dict's keys must be all str, all bytes or all "
                            "int (64-bit)")
        return SharedDict(state)
    raise TypeError("ferry.shared takes a list or a dict, not %s" % type(obj).__name__)


def find_names(root, depth=3):
    """id -> attribute path (``dataset.samples``) of the lists and dicts
    that root holds, for the log."""
    names, todo, seen = {}, [("dataset", root, 0)], set()
    while todo:
        path, obj, d = todo.pop()
        if id(obj) in seen or d > depth:
            continue
        seen.add(id(obj))
        if type(obj) in (list, dict):
            names.setdefault(id(obj), path)
            if len(obj) > 64:
                continue  # its items are rows, not places
            parts = obj.items() if type(obj) is dict else enumerate(obj)
            fmt = "%s[%r]"
        else:
            parts = (getattr(obj, "__dict__", None) or {}).items()
            fmt = "%s.%s"
        for k, v in parts:
            if not isinstance(v, _PLAIN + (np.ndarray,)):
                todo.append((fmt % (path, k), v, d + 1))
    return names

