"""A transform's failure names the sample it failed on, with and without workers."""

from __future__ import annotations

import pytest
from loader_helpers import open_test_shard
from simstore.loaders import SimDataLoader, SimDataset

from simstore.errors import InvalidInputError


def _boom(sample):
    raise ValueError("boom")


def _not_a_dict(sample):
    return [1, 2]


def _int_key(sample):
    return {1: 2}


def _first_batch(store, ref, transform, workers):
    loader = SimDataLoader(SimDataset(store, ref, transform=transform, shuffle=False,
                                      shard_opener=open_test_shard),
                           batch_size=4, num_workers=workers)
    return next(iter(loader))


@pytest.mark.parametrize("workers", [0, 2])
def test_raising_transform_names_the_sample(small, workers):
    store, ref, samples = small
    with pytest.raises(ValueError) as info:
        _first_batch(store, ref, _boom, workers)
    text = "".join(getattr(info.value, "__notes__", [])) + str(info.value)
    assert "boom" in text
    assert "of sample " in text and any(repr(k) in text for k in samples)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("transform", [_not_a_dict, _int_key])
def test_bad_transform_result_names_the_sample(small, workers, transform):
    store, ref, samples = small
    with pytest.raises(InvalidInputError) as info:
        _first_batch(store, ref, transform, workers)
    message = str(info.value)
    assert "\n" not in message
    assert "(sample " in message and any(repr(k) in message for k in samples)


def _missing(sample):
    raise InvalidInputError("the label table has no row for it")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_simstore_error_in_a_transform_keeps_one_line_and_its_note(small, workers):
    # found by an audit: with workers, the note naming the sample came back as a second
    # line of the message
    store, ref, samples = small
    with pytest.raises(InvalidInputError) as info:
        _first_batch(store, ref, _missing, workers)
    assert str(info.value) == "the label table has no row for it"
    notes = info.value.__notes__
    assert len(notes) == 1 and notes[0].startswith("in transform _missing of sample ")
    assert any(repr(k) in notes[0] for k in samples)


class _Opaque:
    def __reduce__(self):
        raise TypeError("cannot pickle '_Opaque' object")


def _unpicklable(sample):
    sample["extra"] = _Opaque()
    return sample


@pytest.mark.multiprocess
@pytest.mark.parametrize("batch_size", [None, 4])
def test_a_result_that_cannot_leave_its_worker_is_an_error_not_a_hang(small, batch_size):
    # found by an audit: the worker's queue printed the pickling error and dropped the
    # batch, and the training process waited for it for ever (as with torch's loader);
    # timeout= only bounds this test
    store, ref, samples = small
    loader = SimDataLoader(SimDataset(store, ref, transform=_unpicklable, shuffle=False,
                                      shard_opener=open_test_shard),
                           batch_size=batch_size, num_workers=2,
                           multiprocessing_context="fork", timeout=120)
    with pytest.raises(InvalidInputError) as info:
        next(iter(loader))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("DataLoader worker ")
    assert "cannot be sent to the training process (TypeError: cannot pickle '_Opaque'" \
        in message
    assert ("sample " if batch_size is None else "the batch of samples ") in message
    assert any(repr(k) in message for k in samples)


def test_a_batch_a_worker_cannot_send_for_want_of_descriptors_names_the_limit():
    # found by a review: a worker out of descriptors (ulimit -n) had its batch called
    # one a transform made unpicklable
    import errno

    from simstore.loaders._workerstart import _unsendable

    from simstore.errors import StorageError

    got = _unsendable(OSError(errno.EMFILE, "Too many open files"),
                      (3, ({"__key__": ["k1", "k2"]}, None)))
    assert got is not None and got[0] == 3 and got[1].exc_type is StorageError
    message = got[1].exc_msg.strip().splitlines()[-1]
    assert "the batch of samples 'k1'... cannot be sent to the training process for want " \
           "of file descriptors in the worker" in message and "ulimit -n" in message
    assert "pickle" not in message
