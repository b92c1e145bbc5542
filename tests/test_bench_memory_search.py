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


def test_the_start_point_scales_with_the_cards_memory():
    """`--start-batch auto`: the H100's answers (bertjax 24 under JAX's 75.2 GiB, transformers 9 on the 80 GB card)
    at the share of this card's memory, and unscaled where the memory is unknown (a CPU, no allocator stats)."""
    from bench.train_bench import scaled_start_batch

    assert scaled_start_batch("bertjax", 8192, 75.2 * 2**30)[0] == 24
    assert scaled_start_batch("transformers", 8192, 81_559 * 2**20)[0] == 9
    start, why = scaled_start_batch("bertjax", 8192, 132.6 * 2**30)  # an H200's limit at 95% preallocated
    assert start == 42 and "132.6 GiB / 75.2 GiB" in why
    assert scaled_start_batch("transformers", 8192, 143_771 * 2**20)[0] == 16  # the H200's whole card
    assert scaled_start_batch("bertjax", 8192, None) == (24, "the H100's 24 at 8192 tokens: this card's memory is "
                                                           "unknown")
    assert scaled_start_batch("bertjax", 4096, None)[0] == 48  # twice the rows at half the tokens


@pytest.mark.parametrize("largest", [40, 41, 42, 43, 44])
def test_on_an_h200_the_scaled_start_brackets_the_answer_within_the_memory_cap(largest):
    """A stand-in fits for an H200 whose largest bertjax batch is near the scaled prediction: the memory stage's
    bertjax share (~170 s at ~50 s a compile) holds 3-4 tries, which the scaled start needs and the H100's 24 does
    not (8-10 tries)."""
    from bench.train_bench import scaled_start_batch

    start, _ = scaled_start_batch("bertjax", 8192, 132.6 * 2**30)
    fits, tries = threshold(largest)
    assert largest_fitting(fits, start=start, near=True) == largest
    assert len(tries) <= 4
    tries.clear()
    assert largest_fitting(fits, start=24, near=True) == largest
    assert len(tries) >= 8


def test_start_batch_takes_a_number_or_auto():
    from bench.train_bench import parse_args

    assert parse_args(["--gpu-max-batch", "bertjax", "--start-batch", "auto"]).start_batch == "auto"
    assert parse_args(["--gpu-max-batch", "bertjax", "--start-batch", "7"]).start_batch == 7
    for bad in ("soon", "0"):
        with pytest.raises(SystemExit):
            parse_args(["--gpu-max-batch", "bertjax", "--start-batch", bad])
