"""Arrays survive the byte and JSON encodings bit for bit; bad lengths and NaN are refused."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from models_store.codecs import (
    decode_matrix,
    decode_vector,
    encode_matrix,
    encode_vector,
    to_json_value,
)

AWKWARD_FLOATS = [
    0.1,
    1 / 3,
    1e-300,
    -0.0,
    5e-324,  # smallest subnormal
    2.225073858507201e-308,  # largest subnormal
    2.2250738585072014e-308,  # smallest normal
    1.7976931348623157e308,
    -1.7976931348623157e308,
    np.nextafter(1.0, 2.0),
    123456789.12345679,
]


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).view(np.uint64)


def test_vector_round_trip_is_bit_exact():
    vector = np.array(AWKWARD_FLOATS)
    decoded = decode_vector(encode_vector(vector), len(vector))
    np.testing.assert_array_equal(bits(decoded), bits(vector))
    assert np.signbit(decoded[3])


def test_matrix_round_trip_is_bit_exact_and_keeps_shape():
    rng = np.random.default_rng(1)
    matrix = rng.standard_normal((7, 3)) * 10.0 ** rng.integers(-300, 300, size=(7, 3))
    matrix[0, :] = AWKWARD_FLOATS[:3]
    matrix[1, :] = AWKWARD_FLOATS[3:6]
    decoded = decode_matrix(encode_matrix(matrix), 7, 3)
    assert decoded.shape == (7, 3)
    np.testing.assert_array_equal(bits(decoded), bits(matrix))


def test_fortran_ordered_and_big_endian_input_encode_as_c_order_little_endian():
    matrix = np.asfortranarray(np.arange(6, dtype=">f8").reshape(2, 3))
    encoded = encode_matrix(matrix)
    assert encoded == struct.pack("<6d", 0.0, 1.0, 2.0, 3.0, 4.0, 5.0)
    np.testing.assert_array_equal(decode_matrix(encoded, 2, 3), matrix)


def test_encoding_is_raw_float64_with_no_header():
    assert encode_vector([1.5, -2.0]) == struct.pack("<2d", 1.5, -2.0)
    assert encode_matrix(np.zeros((0, 4))) == b""
    assert decode_matrix(b"", 0, 4).shape == (0, 4)


def test_decoded_arrays_are_writable_copies():
    decoded = decode_vector(encode_vector([1.0, 2.0]), 2)
    decoded[0] = 5.0
    assert decoded.flags.writeable
    assert decoded[0] == 5.0


@pytest.mark.parametrize(
    ("n_bytes", "rows", "cols"),
    [(8 * 6, 2, 2), (8 * 6 - 1, 2, 3), (8 * 6, 7, 1)],
)
def test_decode_matrix_refuses_a_wrong_byte_length(n_bytes, rows, cols):
    with pytest.raises(ValueError, match=f"needs {8 * rows * cols} bytes, got {n_bytes}"):
        decode_matrix(b"\0" * n_bytes, rows, cols)


def test_decode_vector_refuses_a_wrong_byte_length():
    with pytest.raises(ValueError, match="needs 24 bytes, got 16"):
        decode_vector(encode_vector([1.0, 2.0]), 3)


def test_encode_refuses_the_wrong_number_of_dimensions():
    with pytest.raises(ValueError, match="2-D matrix"):
        encode_matrix([1.0, 2.0])
    with pytest.raises(ValueError, match="1-D vector"):
        encode_vector([[1.0], [2.0]])


def test_json_values_round_trip_bit_exact_through_json_text():
    rng = np.random.default_rng(2)
    nested = {
        "coef": np.vstack([AWKWARD_FLOATS[:5], rng.standard_normal(5)]),
        "intercept": np.float64(-0.0),
        "n": np.int64(3),
        "init": (np.float32(0.5), 0.1),
    }
    converted = to_json_value(nested)
    restored = json.loads(json.dumps(converted, allow_nan=False))
    np.testing.assert_array_equal(bits(restored["coef"]), bits(nested["coef"]))
    assert np.signbit(restored["intercept"])
    assert restored["n"] == 3 and isinstance(converted["n"], int)
    assert restored["init"] == [0.5, 0.1]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), np.array([1.0, -np.inf])])
def test_json_values_refuse_non_finite_numbers(bad):
    with pytest.raises(ValueError, match="non-finite"):
        to_json_value({"values": [bad]})
