"""Writes damaged copies of a sound kolos checkpoint, one directory per case.

    damage_checkpoint.py GOOD_STEP_DIR OUT_DIR

GOOD_STEP_DIR is a step-N directory written by one rank (index.h5 +
shard-0.h5). For each case OUT_DIR/<case> is a damaged copy (or a root with
a `latest` file), and OUT_DIR/cases.tsv lists: case, the directory to pass
to `kolos ckpt verify` / `kolos train --resume`, and what the case damaged.
The expected messages live in checkpoints.sh, next to the commands.
"""
import contextlib
import os
import shutil
import sys

import h5py
import numpy as np

good, out = sys.argv[1], sys.argv[2]
T = "model/h.0.attn.q_proj.weight"  # float32 [32, 32], one piece in shard-0.h5
cases = []


def case(name, what):
    def wrap(fn):
        d = os.path.join(out, name)
        shutil.copytree(good, d)
        target = fn(d) or d
        cases.append((name, target, what))
        return fn
    return wrap


def shard(d, mode="r+"):
    return h5py.File(os.path.join(d, "shard-0.h5"), mode)


def index(d, mode="r+"):
    return h5py.File(os.path.join(d, "index.h5"), mode)


@contextlib.contextmanager
def replacing(f):
    """Deletes dataset T of the open file `f` for the body to write again,
    then gives the new T the old one's attributes."""
    attrs = dict(f[T].attrs)
    del f[T]
    yield
    for k, v in attrs.items():
        f[T].attrs[k] = v


def replace_vds(d, source_file, source_name, shape=(32, 32), dtype="f4"):
    layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
    source = h5py.VirtualSource(source_file, source_name, shape=shape)
    layout[0:shape[0], 0:shape[1]] = source[0:shape[0], 0:shape[1]]
    with index(d) as f, replacing(f):
        f.create_virtual_dataset(T, layout, fillvalue=np.nan)


def rewrite_piece(d, change):
    """The piece's dataset written again as change(its values), with its
    attributes."""
    with shard(d) as f:
        data = change(f[T][()])
        with replacing(f):
            f[T] = data


def set_attr(name, what, key, value=None):
    """A case that sets attribute `key` of the piece's dataset to `value`,
    or deletes it when `value` is None."""
    def damage(d):
        with shard(d) as f:
            if value is None:
                del f[T].attrs[key]
            else:
                f[T].attrs[key] = value
    case(name, what)(damage)


def set_index_attr(name, what, key, value):
    """A case that sets attribute `key` of index.h5's root to `value`."""
    def damage(d):
        with index(d) as f:
            f.attrs[key] = value
    case(name, what)(damage)


@case("shard_wrong_shape", "a piece of shape [16, 32] where the index maps [32, 32]")
def _(d):
    rewrite_piece(d, lambda data: data[:16])


set_attr("offset_outside", "kolos.offset [64, 0] in a [32, 32] tensor", "kolos.offset",
         np.array([64, 0], dtype=np.int64))
set_attr("offset_negative", "kolos.offset [-1, 0]", "kolos.offset",
         np.array([-1, 0], dtype=np.int64))
set_attr("offset_wrong_rank", "kolos.offset with one entry for a 2-d tensor", "kolos.offset",
         np.array([0], dtype=np.int64))
set_attr("offset_string", "kolos.offset is a string", "kolos.offset",
         np.bytes_(b"0,0"))
set_attr("dtype_attr_other", "kolos.dtype says float64 for float32 data", "kolos.dtype",
         np.bytes_(b"float64"))
set_attr("dtype_attr_unknown", "kolos.dtype names no dtype (complex64)", "kolos.dtype",
         np.bytes_(b"complex64"))
set_attr("crc_attr_string", "kolos.crc32c is a string", "kolos.crc32c",
         np.bytes_(b"2008943541"))
set_attr("crc_attr_missing", "no kolos.crc32c attribute", "kolos.crc32c")
set_attr("global_shape_attr_wrong", "kolos.global_shape [32, 33]", "kolos.global_shape",
         np.array([32, 33], dtype=np.int64))


@case("shard_dataset_missing", "the piece's dataset deleted from the shard")
def _(d):
    with shard(d) as f:
        del f[T]


@case("shard_data_float64", "the piece stored as float64")
def _(d):
    rewrite_piece(d, lambda data: data.astype(np.float64))


@case("vds_missing_file", "the index maps a tensor to shard-7.h5, which does not exist")
def _(d):
    replace_vds(d, "shard-7.h5", "/" + T)


@case("vds_missing_dataset", "the index maps a tensor to a dataset the shard lacks")
def _(d):
    replace_vds(d, "shard-0.h5", "/model/no_such_tensor")


@case("vds_absolute_path", "the index maps a tensor to an absolute path outside the checkpoint")
def _(d):
    replace_vds(d, "/nonexistent/elsewhere/shard-0.h5", "/" + T)


@case("index_tensor_missing", "a tensor deleted from the index")
def _(d):
    with index(d) as f:
        del f[T]


@case("index_not_virtual", "a tensor of the index is a plain dataset of zeros")
def _(d):
    with index(d) as f, replacing(f):
        f[T] = np.zeros((32, 32), dtype=np.float32)


@case("index_tensor_float64", "a tensor of the index is float64 (the run's is float32)")
def _(d):
    replace_vds(d, "shard-0.h5", "/" + T, dtype="f8")


set_index_attr("step_attr_string", "the step attribute is a string", "step", np.bytes_(b"four"))
set_index_attr("format_future", "kolos.format 2, a format this version does not know",
               "kolos.format", np.int64(2))
set_index_attr("world_size_huge", "world_size 2^40", "world_size", np.int64(1 << 40))
set_index_attr("step_negative", "the step attribute is -4", "step", np.int64(-4))


@case("rng_wrong_size", "/rng/cpu holds 100 bytes per rank, not a generator state")
def _(d):
    with index(d) as f:
        del f["rng/cpu"]
        f["rng/cpu"] = np.zeros((1, 100), dtype=np.uint8)


@case("rng_wrong_ranks", "/rng/cpu holds 3 generator states for a 1-rank world")
def _(d):
    with index(d) as f:
        state = f["rng/cpu"][()]
        del f["rng/cpu"]
        f["rng/cpu"] = np.concatenate([state] * 3)


set_index_attr("tensors_attr_int", "the tensors attribute is an integer", "tensors", np.int64(7))
set_index_attr("mesh_attr_short", "the mesh attribute has 3 entries", "mesh",
               np.array([1, 1, 1], dtype=np.int64))


@case("index_truncated", "index.h5 cut to half its size")
def _(d):
    p = os.path.join(d, "index.h5")
    os.truncate(p, os.path.getsize(p) // 2)


@case("index_empty", "index.h5 of zero bytes")
def _(d):
    os.truncate(os.path.join(d, "index.h5"), 0)


@case("shard_truncated_header", "shard-0.h5 cut to 512 bytes")
def _(d):
    os.truncate(os.path.join(d, "shard-0.h5"), 512)


@case("index_foreign_hdf5", "index.h5 is another program's HDF5 file")
def _(d):
    os.remove(os.path.join(d, "index.h5"))
    with h5py.File(os.path.join(d, "index.h5"), "w") as f:
        f["x"] = np.arange(10)
        f.attrs["creator"] = "someone else"


@case("index_text", "index.h5 is a text file")
def _(d):
    with open(os.path.join(d, "index.h5"), "w") as f:
        f.write("not hdf5\n")


@case("latest_missing_target", "a root whose latest names step-00000099, absent")
def _(d):
    root = d + "-root"
    os.makedirs(root)
    shutil.move(d, os.path.join(root, "step-00000004"))
    with open(os.path.join(root, "latest"), "w") as f:
        f.write("step-00000099\n")
    return root


@case("latest_outside", "a root whose latest says ../../etc")
def _(d):
    root = d + "-root"
    os.makedirs(root)
    shutil.move(d, os.path.join(root, "step-00000004"))
    with open(os.path.join(root, "latest"), "w") as f:
        f.write("../../etc\n")
    return root


with open(os.path.join(out, "cases.tsv"), "w") as f:
    for name, target, what in cases:
        f.write(f"{name}\t{target}\t{what}\n")
print(len(cases), "damaged checkpoints in", out)
