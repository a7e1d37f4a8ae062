"""Big lists and dicts of a dataset object reach process workers in compact
shared form (ferry._shared): they read as the originals, cost a worker no
copy as it reads them, and turn into a worker's own copy when it changes
them."""

import copy
import logging
import pickle

import numpy as np
import pytest

import ferry
from ferry import _shared
from ferry.torch import DataLoader
from datasets import HoldsCollections


def _round_trip(obj):
    """obj through the handoff's pickling (what a clean parent gets)."""
    from ferry import _handoff
    import io
    buffers = []
    data = _handoff._dumps(obj, lambda b: buffers.append(b.raw()) or False)
    u = pickle.Unpickler(io.BytesIO(data), buffers=buffers)
    u.persistent_load = _shared.Decoder()
    return u.load()


def _rows(n):
    return [{"path": "/d/%d.jpg" % k, "label": k % 10} for k in range(n)]



@pytest.mark.parametrize("misfit", [None, 0, "middle", -1])
@pytest.mark.parametrize("threads", [2, 3, 8])
def test_the_encoders_in_threads_give_the_bytes_one_thread_gives(misfit, threads):
    """The one-pass encoders cut a big collection into parts, one a thread
    (python/src/columns.c): whatever the parts, the columns, ends and table
    are the one thread's byte for byte, and an item that does not fit,
    wherever it is, sends the whole down the general path (None)."""
    from ferry import _ferry
    n = 3001
    rows = [{"path": "/d/%d.jpg" % k * (1 + k % 7), "label": k - 1500, "w": k / 7}
            for k in range(n)]
    vocab = {r["path"] + str(k): r["label"] for k, r in enumerate(rows)}
    names = {"name%d" % k: "/d/%d.jpg" % k * (1 + k % 5) for k in range(n)}  # str values
    if misfit is not None:
        at = n // 2 if misfit == "middle" else misfit
        rows[at]["label"] = 2**64
        vocab[list(vocab)[at]] = 1.5  # the values' column only: the keys still go
        names[list(names)[at]] = b"bytes"
    keys = tuple(rows[0])
    one = _ferry.records_encode(rows, keys, 1)
    assert (one is None) == (misfit is not None)
    assert _ferry.records_encode(rows, keys, threads) == one
    for d in (vocab, names):
        one = _ferry.str_dict_encode(d, 1)
        assert one is not None and (one[3] is None) == (misfit is not None)
        assert _ferry.str_dict_encode(d, threads) == one
    assert _ferry.str_dict_encode({**vocab, "ü": 1}, threads) is None  # a key not ASCII


@pytest.mark.parametrize("misfit", [None, 0, "middle", -1])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_lists_of_tuples_and_of_values_encode_in_one_pass_as_the_general_path_does(
        misfit, threads):
    """A list of tuples (an ImageFolder's samples) and a list of values
    (paths, labels, weights) are encoded in one pass in C, in threads: the
    same rows, byte for byte, as the general path (each place's list, then
    its column); an item that does not fit, wherever it is, sends the whole
    list down the general path, which encodes it as it always did."""
    from ferry import _ferry
    n = 3001
    samples = [("/d/%d.jpg" % k * (1 + k % 7), k - 1500, k / 7) for k in range(n)]
    paths = [p for p, _, _ in samples]
    labels = [c for _, c, _ in samples]
    weights = [w for _, _, w in samples]
    odd = {"samples": ("/d/ü.jpg", 1, 1.0), "paths": "/d/ü.jpg", "labels": True,
           "weights": 1}  # not ASCII, a bool, an int among floats
    lists = {"samples": samples, "paths": paths, "labels": labels, "weights": weights}
    if misfit is not None:
        at = n // 2 if misfit == "middle" else misfit
        for name, items in lists.items():
            items[at] = odd[name]
    for name, items in lists.items():
        if name == "samples":
            got = _ferry.tuples_encode(items, 3, threads)
            general = ("tuple", [_shared.encode_column(c, plain=True)
                                 for c in _ferry.tuple_columns(items, 3)])
        else:
            got = _ferry.values_encode(items, threads)
            general = ("value", _shared.encode_column(items))
        assert (got is None) == (misfit is not None), name
        assert _same_rows(_shared._encode_rows(items, True), general), name
        if got is not None:
            assert got == _ferry.tuples_encode(items, 3, 1) if name == "samples" else \
                got == _ferry.values_encode(items, 1)
    assert _ferry.tuples_encode(samples, 2) is None  # another width
    assert _ferry.tuples_encode([tuple(x) for x in samples[:3]] + [list(samples[3])], 3) \
        is None  # a list among the tuples
    s = ferry.shared(samples)
    assert list(s) == samples and s[n // 2] == samples[n // 2]


def _same_rows(a, b):
    """Whether two encoded rows hold the same kinds, dtypes and bytes."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and \
            a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and \
            all(_same_rows(x, y) for x, y in zip(a, b))
    return a == b


def _key_hash8(keys):
    """columns.c's key_hash of 8-byte ASCII keys, in numpy (one word each)."""
    w = np.frombuffer("".join(keys).encode(), dtype="<u8")
    with np.errstate(over="ignore"):
        h = (np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(8)) ^ w
        h = h * np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(29)
        h ^= h >> np.uint64(33)
        h = h * np.uint64(0xC4CEB9FE1A85EC53)
        h ^= h >> np.uint64(33)
    return h


def test_a_big_dicts_table_is_the_same_whatever_the_threads_and_finds_every_key():
    """Past 2^17 keys the lookup table is filled in 16 regions at once, and
    a key that runs off its region's end is put aside and placed last. Keys
    chosen so that some region has three whose home is one of its last two
    slots (one of them must be put aside): the table's bytes (which name a
    host's shared copy) do not depend on the threads, a key put aside lies
    past its region, and every key is found where it is."""
    from ferry import _ferry
    size, rsize = 1 << 19, (1 << 19) // 16  # the table of 131,073 to 262,144 keys
    cands = ["x%07d" % k for k in range(1000000)]
    home = _key_hash8(cands) & np.uint64(size - 1)
    last = np.nonzero(home % np.uint64(rsize) >= np.uint64(rsize - 2))[0]
    crafted = [cands[i] for i in last]
    per_region = np.bincount((home[last] // np.uint64(rsize)).astype(np.int64), minlength=16)
    assert per_region.max() >= 3, per_region
    d = {k: i for i, k in enumerate(crafted)}
    for k in range(140000 - len(d)):
        d["k%d" % k] = k
    tables = {t: _ferry.str_dict_encode(d, t) for t in (1, 2, 5)}
    assert tables[1] == tables[2] == tables[5]
    blob, ends, table, _ = tables[1]
    ends = np.frombuffer(ends, dtype=np.int64)
    slots = np.frombuffer(table, dtype=np.uint32)  # 4-byte slots below 2**31 keys
    assert len(slots) == size
    where = np.empty(len(d), dtype=np.int64)
    where[slots[slots > 0].astype(np.int64) - 1] = np.nonzero(slots > 0)[0]
    past = 0
    for pos, key in enumerate(crafted):
        h = int(_key_hash8([key])[0]) & (size - 1)
        assert 0 <= (int(where[pos]) - h) % size < 64  # at its home or probed on from it
        past += int(where[pos]) // rsize != h // rsize
    assert past >= 1  # put aside, then placed in the next region
    keys = list(d)
    for i in list(range(0, len(keys), 7)) + list(range(len(crafted))) + [len(keys) - 1]:
        assert _ferry.str_find(table, blob, ends, keys[i]) == i
    assert _ferry.str_find(table, blob, ends, "absent") == -1
    assert _ferry.str_index(blob, ends) == table  # the general path's table too
    # A table of 8-byte slots (every table before 4-byte ones) still finds
    # its keys; a table of another length is an error, not "absent".
    wide = slots.astype(np.uint64).tobytes()
    assert all(_ferry.str_find(wide, blob, ends, keys[i]) == i for i in (0, 7, len(keys) - 1))
    assert _ferry.str_find(wide, blob, ends, "absent") == -1
    with pytest.raises(ValueError, match="not that of"):
        _ferry.str_find(table[:-4], blob, ends, keys[0])


def test_a_big_list_of_dicts_reads_as_the_list():
    rows = _rows(_shared.AUTO_MIN)
    s = _round_trip({"rows": rows})["rows"]
    assert isinstance(s, ferry.SharedList) and len(s) == len(rows)
    assert s[0] == rows[0] and s[-1] == rows[-1] and s[12345] == rows[12345]
    assert s[10:20] == rows[10:20] and s[::-25000] == rows[::-25000]
    assert s == rows and rows == s and not (s != rows)
    assert list(s) == rows and rows[77] in s and {"x": 1} not in s
    assert s.index(rows[9]) == 9 and s.count(rows[9]) == 1
    assert list(reversed(s))[:2] == rows[::-1][:2]
    with pytest.raises(IndexError):
        s[len(rows)]
    with pytest.raises(TypeError):
        s["a"]
    with pytest.raises(TypeError):
        hash(s)
    assert copy.copy(s) == rows and type(copy.deepcopy(s)) is list


def test_a_read_item_is_a_fresh_equal_dict_and_tuples_keep_their_types():
    pairs = [("p%d" % k, k, float(k) / 3, k % 2 == 0, None, b"\x00\xff" * (k % 3))
             for k in range(_shared.AUTO_MIN)]
    uni = ["ünï\udc80%d" % k for k in range(_shared.AUTO_MIN)]  # surrogates kept
    big = [2**70 + k for k in range(_shared.AUTO_MIN)]  # beyond int64: pickled values
    got = _round_trip([pairs, uni, big, _rows(_shared.AUTO_MIN)])
    assert got[0] == pairs and got[1] == uni and got[2] == big
    assert [type(v) for v in got[0][5]] == [str, int, float, bool, type(None), bytes]
    a, b = got[3][3], got[3][3]
    assert a == b and a is not b and type(a) is dict


def test_a_big_vocabulary_looks_up_as_the_dict():
    vocab = {"w%d" % k: k for k in range(_shared.AUTO_MIN)}
    vocab["ü"] = -1
    ints = {k * 7919: "v%d" % k for k in range(_shared.AUTO_MIN)}
    v, i = _round_trip((vocab, ints))
    assert isinstance(v, ferry.SharedDict) and isinstance(i, ferry.SharedDict)
    assert len(v) == len(vocab) and v == vocab and vocab == v
    assert all(v["w%d" % k] == k for k in range(0, _shared.AUTO_MIN, 97))
    assert v["ü"] == -1 and "w5" in v and "nope" not in v and 5 not in v
    assert v.get("nope", 7) == 7 and list(v)[:3] == ["w0", "w1", "w2"]
    assert list(v.items())[-1] == ("ü", -1) and sum(v.values()) == sum(vocab.values())
    with pytest.raises(KeyError):
        v["nope"]
    with pytest.raises(TypeError):
        v[["unhashable"]]
    # int keys: whatever number equals one finds it, as in a dict
    assert i[7919] == "v1" and i[np.int64(7919)] == "v1" and i[7919.0] == "v1"
    assert i.get(7919.5) is None and i.get("7919") is None
    assert (v | {"x": 1})["x"] == 1 and ({"x": 1} | v)["w3"] == 3


def _same(a, b):
    """Equal item by item, with the same types (nan equal to nan)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y)
        if isinstance(x, dict):
            assert list(x) == list(y)
            _same(list(x.values()), list(y.values()))
        elif isinstance(x, float):
            assert x == y or (x != x and y != y)
            assert str(x) == str(y)  # -0.0 stays -0.0
        else:
            assert x == y


@pytest.mark.parametrize("shape", ["plain", "edges", "long", "late-bool", "late-float",
                                   "late-big", "late-unicode", "late-key"])
def test_the_one_pass_encoders_give_what_the_general_path_gives(shape, monkeypatch):
    n = _shared.AUTO_MIN
    rows = [{"path": "/d/%d.jpg" % k, "label": k - n // 2, "w": k / 7} for k in range(n)]
    if shape == "edges":
        rows[1] = {"path": "", "label": 2**63 - 1, "w": float("nan")}
        rows[2] = {"path": "x" * 3, "label": -2**63, "w": -0.0}
        rows[3] = {"path": "\x7f", "label": 0, "w": float("-inf")}
    elif shape == "long":
        rows = [dict(r, path=r["path"] * 40) for r in rows]  # past the first guess: regrown
    elif shape == "late-bool":
        rows[-1]["label"] = True  # a bool is no int here: the general path keeps it a bool
    elif shape == "late-float":
        rows[-1]["label"] = 1.5
    elif shape == "late-big":
        rows[-1]["label"] = 2**64
    elif shape == "late-unicode":
        rows[-1]["path"] = "/d/ü.jpg"
    elif shape == "late-key":
        rows[-1] = {"label": 1, "path": "/x", "w": 0.5}  # the same keys in another order
    vocab = {r["path"] + str(k): r["label"] for k, r in enumerate(rows)}
    fast_list = _round_trip(rows)
    fast_dict = _round_trip(vocab)
    from ferry import _ferry
    one_pass = _ferry.records_encode(rows, tuple(rows[0])) is not None
    assert one_pass == (shape in ("plain", "edges", "long"))  # the others: the general path
    assert (_ferry.str_dict_encode(vocab) is not None) == (shape != "late-unicode")
    monkeypatch.setattr(_ferry, "records_encode", lambda *a: None)
    monkeypatch.setattr(_ferry, "str_dict_encode", lambda *a: None)
    slow_list = _round_trip(rows)
    slow_dict = _round_trip(vocab)
    _same(fast_list, rows)
    _same(fast_list, slow_list)
    assert type(fast_list) is type(slow_list)
    assert type(fast_dict) is type(slow_dict)
    assert list(fast_dict) == list(vocab) and fast_dict == vocab
    _same(list(fast_dict.values()), list(vocab.values()))
    for k in list(vocab)[::97] + [list(vocab)[-1]]:
        assert fast_dict[k] == vocab[k] and type(fast_dict[k]) is type(vocab[k])
    assert "/nope" not in fast_dict and fast_dict.get("") is None


def test_one_long_first_value_does_not_size_the_whole_column():
    """The one-pass encoder guesses a string column's size from its first
    value: a first path of a megabyte among short ones once asked for
    n megabytes (MemoryError); and a state with the old table (kind "str",
    FNV-1a) still finds its keys."""
    n = _shared.AUTO_MIN
    rows = [{"p": "x" * (1 << 20) if k == 0 else "y", "k": k} for k in range(n)]
    vocab = {("w" * (1 << 20) if k == 0 else "w%d" % k): k for k in range(n)}
    got_rows, got_vocab = _round_trip((rows, vocab))
    assert len(got_rows[0]["p"]) == 1 << 20 and got_rows[n - 1] == rows[n - 1]
    assert got_vocab["w" * (1 << 20)] == 0 and got_vocab["w%d" % (n - 1)] == n - 1
    n2, kind, keys, values, table = got_vocab._state
    assert kind == "str8"
    old = ferry.SharedDict((n2, "str", keys, values, np.zeros_like(table)))  # a stale table
    assert old["w5"] == 5 and "nope" not in old and old._state[1] == "str8"


def test_a_vocabulary_of_float_or_str_values_is_packed_too_and_finds_every_key():
    n = _shared.AUTO_MIN
    floats = {"k%d" % k: k / 3 for k in range(n)}
    strs = {"k%d" % k: "v%d" % k for k in range(n)}
    mixed = {"k%d" % k: (k if k % 2 else "v%d" % k) for k in range(n)}  # values: general path
    f, s, m = _round_trip((floats, strs, mixed))
    for got, want in ((f, floats), (s, strs), (m, mixed)):
        assert isinstance(got, ferry.SharedDict)
        assert all(got[k] == v and type(got[k]) is type(v) for k, v in want.items())
        assert "k%d" % n not in got and len(got) == n


def test_a_change_in_a_worker_makes_its_own_copy_and_says_so(caplog):
    rows = _rows(_shared.AUTO_MIN)
    s, v = _round_trip(([*rows], {"w%d" % k: k for k in range(_shared.AUTO_MIN)}))
    with caplog.at_level(logging.INFO, logger="ferry"):
        s.append({"path": "new", "label": 1})
        s[0] = "first"
        v["w1"] = 100
        del v["w2"]
    assert len(s) == len(rows) + 1 and s[0] == "first" and s[-1]["path"] == "new"
    assert s[1] == rows[1] and v["w1"] == 100 and "w2" not in v and len(v) == _shared.AUTO_MIN - 1
    said = [r.getMessage() for r in caplog.records]
    assert sum("changed the dataset's shared list" in m for m in said) == 1
    assert sum("changed the dataset's shared dict" in m for m in said) == 1
    s.sort(key=lambda r: str(r))  # a list's own methods, on the copy
    assert len(s) == len(rows) + 1


def test_small_lists_mutable_items_and_subclasses_stay_as_they_are():
    class Tagged(list):
        pass
    small = _rows(10)
    nested = [{"tags": [k]} for k in range(_shared.AUTO_MIN)]  # a list inside each item
    sub = Tagged(range(_shared.AUTO_MIN))
    mixed_keys = {k if k % 2 else str(k): k for k in range(_shared.AUTO_MIN)}
    got = _round_trip([small, nested, sub, mixed_keys])
    assert type(got[0]) is list and type(got[1]) is list and type(got[2]) is Tagged
    assert type(got[3]) is dict and got[1] == nested


def test_share_collections_false_and_ferry_shared():
    from ferry import _handoff
    rows = _rows(_shared.AUTO_MIN)
    buffers = []
    data = _handoff._dumps({"rows": rows}, lambda b: buffers.append(b.raw()) or False,
                           share_collections=False)
    assert type(pickle.loads(data, buffers=buffers)["rows"]) is list
    nested = ferry.shared([{"tags": [k]} for k in range(100)])  # on request: anything
    assert isinstance(nested, ferry.SharedList) and nested[5] == {"tags": [5]}
    assert pickle.loads(pickle.dumps(nested))[7] == {"tags": [7]}
    with pytest.raises(TypeError, match="keys must be all str"):
        ferry.shared({1: 2, "a": 3})


def test_workers_read_every_item_without_copying_the_collections():
    ds = HoldsCollections(n=200_000, items=4)
    want = {"labels": sum(s["label"] for s in ds.samples),
            "paths": sum(len(s["path"]) for s in ds.samples),
            "words": sum(range(0, 200_000, 3)), "pairs": sum(p[1] for p in ds.pairs)}
    grew = {}
    for share in (True, False):
        with DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True,
                        share_collections=share) as dl:
            items = list(dl)
        assert sorted(int(it["i"]) for it in items) == [0, 1, 2, 3]
        for it in items:
            for key, value in want.items():
                assert int(it[key]) == value, (share, key)
            assert bool(it["same"]) and int(it["missing"]) == -1
            assert str(it["row"]) == repr(ds.samples[int(it["i"])])
        grew[share] = max(int(it["grew_kb"]) for it in items)
        types = {str(it["types"]) for it in items}
        assert types == ({"SharedList SharedDict SharedList"} if share else {"list dict list"})
    # Reading 200,000 dicts, words and pairs copies some 50 MiB of pages
    # into a worker that holds them as objects; the shared form, almost none.
    assert grew[False] > 30 * 1024, grew
    assert grew[True] < 8 * 1024, grew
    assert type(ds.samples) is list and type(ds.vocab) is dict  # the trainer's, untouched


def test_rows_whose_keys_differ_in_order_stay_a_list_and_odd_keys_still_look_up():
    rows = [{"a": k, "b": str(k)} for k in range(_shared.AUTO_MIN)]
    rows.append({"b": "x", "a": 0})  # the same keys, another order: iteration differs
    vocab = {"w%d" % k: k for k in range(_shared.AUTO_MIN)}
    vocab["\udc80lone"] = -7  # a lone surrogate (os.fsdecode of a bad file name)
    got_rows, got_vocab = _round_trip((rows, vocab))
    assert type(got_rows) is list and got_rows == rows
    assert isinstance(got_vocab, ferry.SharedDict) and got_vocab["\udc80lone"] == -7
    assert got_vocab["w99999"] == 99999 and "w100000" not in got_vocab


class _FreshLists:
    """Pickles as a new big list each time (a __getstate__ that builds one)."""

    def __init__(self, tag):
        self.tag = tag

    def __getstate__(self):
        return {"tag": self.tag, "rows": ["%s%d" % (self.tag, k) for k in range(_shared.AUTO_MIN)]}


def test_big_lists_a_reducer_makes_and_drops_keep_their_own_data():
    # Each temporary list is freed once pickled; another may then get its
    # address, and must not be taken for it.
    got = _round_trip([_FreshLists(t) for t in "abc"])
    assert [g.__dict__["rows"][0] for g in got] == ["a0", "b0", "c0"]


def test_an_object_array_round_trips_whatever_its_size():
    arr = np.empty(_shared.AUTO_MIN + 3, dtype=object)
    arr[:] = [("p", k) if k % 2 else [k] for k in range(len(arr))]
    grid = np.array([[{"a": 1}, None], ["x", 2.5]], dtype=object)
    got, got_grid = _round_trip((arr, grid))
    assert got.dtype == object and got.shape == arr.shape and list(got) == list(arr)
    assert got_grid.shape == (2, 2) and got_grid[0, 0] == {"a": 1} and got_grid[1, 1] == 2.5
