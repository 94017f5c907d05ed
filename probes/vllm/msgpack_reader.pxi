# Included by wire_columns.pyx: bounds-checked msgpack readers over a byte range.
#
# Format facts (the msgpack specification, github.com/msgpack/msgpack/blob/master/spec.md):
# fixint 0x00-0x7f / 0xe0-0xff, fixmap 0x80-0x8f, fixarray 0x90-0x9f, fixstr 0xa0-0xbf, nil 0xc0,
# false/true 0xc2/0xc3, bin 0xc4-0xc6, ext 0xc7-0xc9 and 0xd4-0xd8, float 0xca/0xcb,
# uint 0xcc-0xcf, int 0xd0-0xd3, str 0xd9-0xdb, array 0xdc/0xdd, map 0xde/0xdf; lengths and
# numbers big-endian. Every reader returns -1 (or a negative count) on anything it does not
# accept; the caller then leaves the frame to the general decoder.

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t

cdef struct Reader:
    const uint8_t* p
    Py_ssize_t pos
    Py_ssize_t end


cdef inline bint short_of(Reader* r, Py_ssize_t n) noexcept nogil:
    return r.end - r.pos < n


cdef inline uint64_t big_endian(const uint8_t* p, int n) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    return v


cdef inline Py_ssize_t read_array(Reader* r) noexcept nogil:
    """An array header: its length, or -1."""
    if short_of(r, 1):
        return -1
    cdef uint8_t b = r.p[r.pos]
    if 0x90 <= b <= 0x9f:
        r.pos += 1
        return b & 0x0f
    if b == 0xdc and not short_of(r, 3):
        r.pos += 3
        return <Py_ssize_t>big_endian(r.p + r.pos - 2, 2)
    if b == 0xdd and not short_of(r, 5):
        r.pos += 5
        return <Py_ssize_t>big_endian(r.p + r.pos - 4, 4)
    return -1


cdef inline Py_ssize_t read_map(Reader* r) noexcept nogil:
    """A map header: its number of pairs, or -1."""
    if short_of(r, 1):
        return -1
    cdef uint8_t b = r.p[r.pos]
    if 0x80 <= b <= 0x8f:
        r.pos += 1
        return b & 0x0f
    if b == 0xde and not short_of(r, 3):
        r.pos += 3
        return <Py_ssize_t>big_endian(r.p + r.pos - 2, 2)
    if b == 0xdf and not short_of(r, 5):
        r.pos += 5
        return <Py_ssize_t>big_endian(r.p + r.pos - 4, 4)
    return -1


cdef inline bint valid_utf8(const uint8_t* s, Py_ssize_t n) noexcept nogil:
    """Strict UTF-8 as Python decodes it: no overlongs, surrogates or code points > U+10FFFF."""
    cdef Py_ssize_t i = 0, k, need
    cdef uint8_t c, c1
    while i < n:
        c = s[i]
        if c < 0x80:
            i += 1
            continue
        if 0xc2 <= c <= 0xdf:
            need = 1
        elif 0xe0 <= c <= 0xef:
            need = 2
        elif 0xf0 <= c <= 0xf4:
            need = 3
        else:
            return False
        if i + need >= n:
            return False
        c1 = s[i + 1]
        if (c == 0xe0 and c1 < 0xa0) or (c == 0xed and c1 > 0x9f) \
                or (c == 0xf0 and c1 < 0x90) or (c == 0xf4 and c1 > 0x8f):
            return False
        for k in range(1, need + 1):
            if s[i + k] & 0xc0 != 0x80:
                return False
        i += need + 1
    return True


cdef inline int read_str(Reader* r, Py_ssize_t* start, Py_ssize_t* n, bint* ascii) noexcept nogil:
    """A str: sets its byte range and whether it is pure ASCII; -1 if not a valid UTF-8 str."""
    if short_of(r, 1):
        return -1
    cdef uint8_t b = r.p[r.pos]
    cdef Py_ssize_t head, length, i
    if 0xa0 <= b <= 0xbf:
        head, length = 1, b & 0x1f
    elif b == 0xd9 and not short_of(r, 2):
        head, length = 2, r.p[r.pos + 1]
    elif b == 0xda and not short_of(r, 3):
        head, length = 3, <Py_ssize_t>big_endian(r.p + r.pos + 1, 2)
    elif b == 0xdb and not short_of(r, 5):
        head, length = 5, <Py_ssize_t>big_endian(r.p + r.pos + 1, 4)
    else:
        return -1
    if short_of(r, head + length):
        return -1
    ascii[0] = True
    for i in range(length):
        if r.p[r.pos + head + i] >= 0x80:
            ascii[0] = False
            break
    if not ascii[0] and not valid_utf8(r.p + r.pos + head, length):
        return -1
    start[0] = r.pos + head
    n[0] = length
    r.pos += head + length
    return 0


cdef inline int read_int(Reader* r, uint64_t* v, bint* negative) noexcept nogil:
    """An integer (never a bool), as its two's-complement 64 bits; -1 if not an integer."""
    if short_of(r, 1):
        return -1
    cdef uint8_t b = r.p[r.pos]
    cdef int width
    cdef uint64_t raw
    negative[0] = False
    if b <= 0x7f:
        v[0] = b
        r.pos += 1
        return 0
    if b >= 0xe0:
        v[0] = <uint64_t><int64_t><int8_t>b
        negative[0] = True
        r.pos += 1
        return 0
    if 0xcc <= b <= 0xcf:
        width = 1 << (b - 0xcc)
    elif 0xd0 <= b <= 0xd3:
        width = 1 << (b - 0xd0)
    else:
        return -1
    if short_of(r, 1 + width):
        return -1
    raw = big_endian(r.p + r.pos + 1, width)
    r.pos += 1 + width
    if b <= 0xcf:
        v[0] = raw
        return 0
    if width == 1:
        v[0] = <uint64_t><int64_t><int8_t>raw
    elif width == 2:
        v[0] = <uint64_t><int64_t><int16_t>raw
    elif width == 4:
        v[0] = <uint64_t><int64_t><int32_t>raw
    else:
        v[0] = raw
    negative[0] = (<int64_t>v[0]) < 0
    return 0


cdef inline int read_bin(Reader* r, Py_ssize_t* start, Py_ssize_t* n) noexcept nogil:
    if short_of(r, 1):
        return -1
    cdef uint8_t b = r.p[r.pos]
    cdef int head
    if b == 0xc4:
        head = 2
    elif b == 0xc5:
        head = 3
    elif b == 0xc6:
        head = 5
    else:
        return -1
    if short_of(r, head):
        return -1
    cdef Py_ssize_t length = <Py_ssize_t>big_endian(r.p + r.pos + 1, head - 1)
    if short_of(r, head + length):
        return -1
    start[0] = r.pos + head
    n[0] = length
    r.pos += head + length
    return 0


cdef int skip(Reader* r, int depth) noexcept nogil:
    """Step over one well-formed value (no ext types); -1 otherwise."""
    cdef Py_ssize_t n, i, start, length
    cdef uint8_t b
    cdef bint ascii
    if depth > 64 or short_of(r, 1):
        return -1
    b = r.p[r.pos]
    if b <= 0x7f or b >= 0xe0 or b == 0xc0 or b == 0xc2 or b == 0xc3:
        r.pos += 1
        return 0
    if 0x80 <= b <= 0x8f or b == 0xde or b == 0xdf:
        n = read_map(r)
        if n < 0:
            return -1
        for i in range(2 * n):
            if skip(r, depth + 1):
                return -1
        return 0
    if 0x90 <= b <= 0x9f or b == 0xdc or b == 0xdd:
        n = read_array(r)
        if n < 0:
            return -1
        for i in range(n):
            if r.pos < r.end:  # token lists: small ints without a call
                b = r.p[r.pos]
                if b <= 0x7f or b >= 0xe0 or b == 0xc0:
                    r.pos += 1
                    continue
                if b == 0xcc or b == 0xd0:
                    r.pos += 2
                    continue
                if b == 0xcd or b == 0xd1:
                    r.pos += 3
                    continue
                if b == 0xce or b == 0xd2:
                    r.pos += 5
                    continue
            if skip(r, depth + 1):
                return -1
        return -1 if r.pos > r.end else 0
    if 0xa0 <= b <= 0xbf or 0xd9 <= b <= 0xdb:
        return read_str(r, &start, &length, &ascii)
    if 0xc4 <= b <= 0xc6:
        return read_bin(r, &start, &length)
    if b == 0xca:
        n = 5
    elif b == 0xcb:
        n = 9
    elif 0xcc <= b <= 0xcf:
        n = 1 + (1 << (b - 0xcc))
    elif 0xd0 <= b <= 0xd3:
        n = 1 + (1 << (b - 0xd0))
    else:
        return -1  # ext types and the reserved 0xc1: the general decoder decides
    if short_of(r, n):
        return -1
    r.pos += n
    return 0
