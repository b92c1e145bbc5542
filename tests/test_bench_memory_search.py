"""The largest-batch search of bench/train_bench.py (`--gpu-max-batch`), against a brute force: it must find the
exact largest fitting batch with about 2 log2(b) tries, count only out-of-memory errors as a no, and raise the rest."""

import pytest

from bench.train_bench import is_out_of_memory, largest_fitting, memory_probe


def threshold(largest: int):
    """fits(batch) = batch <= largest, and the list of the batches it was asked about."""
    tries = []

    def fits(batch):
        tries.append(batch)
        return batch <= largest

    return fits, tries


@pytest.mark.parametrize("largest", [0, 1, 2, 5, 37, 64, 100])
def test_largest_fitting_finds_the_threshold_with_few_tries(largest):
    fits, tries = threshold(largest)
    assert largest_fitting(fits, limit=100) == max(b for b in range(101) if b <= largest)
    assert len(tries) == len(set(tries)) <= 2 * 7 + 1
    for start in (3, 8, 100, 500):  # from above or below the answer, and beyond the limit
        tries.clear()
        assert largest_fitting(fits, limit=100, start=start) == largest
        assert len(tries) == len(set(tries)) <= 2 * 7 + 1


def test_memory_probe_counts_only_out_of_memory_as_a_no():
    released = []

    def attempt(batch):
        if batch > 5:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB")
        return True

    assert largest_fitting(memory_probe("x", attempt, lambda: released.append(1))) == 5
    assert len(released) == 6  # 1 2 4 8 6 5: freed after every try, failed or not

    def broken(batch):
        raise ValueError("incompatible shapes")

    with pytest.raises(ValueError, match="incompatible shapes"):
        largest_fitting(memory_probe("x", broken, lambda: None))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_memory(RuntimeError("INVALID_ARGUMENT: bad shape"))


@pytest.mark.parametrize("largest", [0, 1, 2, 5, 37, 64, 100])
def test_largest_fitting_from_a_prediction(largest):
    """near=True: a right prediction costs two tries, a wrong one about 2 log2 of its error; the answer is exact."""
    fits, tries = threshold(largest)
    for guess in (1, 3, 36, 37, 38, 64, 100, 500):
        tries.clear()
        assert largest_fitting(fits, limit=100, start=guess, near=True) == largest
        assert len(tries) == len(set(tries))
        error = abs(min(guess, 100) - largest)
        assert len(tries) <= 2 * (error + 1).bit_length() + 1
        if error == 0 and 0 < largest < 100:
            assert tries == [largest, largest + 1]
