/*
 * pickle.c — the protocol-2 pickle writer (format and rules in pickle.h).
 *
 * Invariants: 0 <= depth <= GP_PICKLE_MAX_DEPTH; open[i] is the kind of the i-th open container and
 * items[i] the values written into it so far; every value written bumps the count of the innermost
 * open container (a dict's keys and values alike, so a dict must close with an even count).
 */
#include "base/pickle.h"

#include <stdlib.h>
#include <string.h>

enum {
    OP_PROTO = 0x80, OP_STOP = '.', OP_MARK = '(', OP_EMPTY_DICT = '}', OP_EMPTY_LIST = ']',
    OP_SETITEMS = 'u', OP_APPENDS = 'e', OP_TUPLE = 't', OP_BININT1 = 'K', OP_BININT2 = 'M',
    OP_BININT = 'J', OP_LONG1 = 0x8a, OP_BINUNICODE = 'X', OP_NEWTRUE = 0x88, OP_NEWFALSE = 0x89,
    OP_NONE = 'N', OP_BINFLOAT = 'G'
};

static void put(gp_pickle *pk, const void *bytes, size_t n)
{
    if (pk->failed)
        return;
    if (pk->len + n > pk->cap) {
        size_t cap = pk->cap ? pk->cap : 4096;
        while (cap < pk->len + n)
            cap *= 2;
        unsigned char *grown = realloc(pk->buf, cap);
        if (grown == NULL) {
            pk->failed = true;
            return;
        }
        pk->buf = grown;
        pk->cap = cap;
    }
    memcpy(pk->buf + pk->len, bytes, n);
    pk->len += n;
}

static void put_byte(gp_pickle *pk, unsigned char c)
{
    put(pk, &c, 1);
}

static void put_le(gp_pickle *pk, uint64_t v, unsigned n)
{
    unsigned char b[8];
    for (unsigned i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    put(pk, b, n);
}

/* A value is about to be written into the innermost container. */
static void count_value(gp_pickle *pk)
{
    if (pk->depth > 0)
        pk->items[pk->depth - 1]++;
}

void gp_pickle_init(gp_pickle *pk)
{
    memset(pk, 0, sizeof *pk);
    put_byte(pk, OP_PROTO);
    put_byte(pk, 2);
}

void gp_pickle_free(gp_pickle *pk)
{
    free(pk->buf);
    pk->buf = NULL;
    pk->len = pk->cap = 0;
}

static void open_container(gp_pickle *pk, char kind)
{
    count_value(pk);
    if (pk->depth == GP_PICKLE_MAX_DEPTH) {
        pk->misuse = true;
        return;
    }
    if (kind == 'd')
        put_byte(pk, OP_EMPTY_DICT);
    else if (kind == 'l')
        put_byte(pk, OP_EMPTY_LIST);
    put_byte(pk, OP_MARK);
    pk->open[pk->depth] = kind;
    pk->items[pk->depth] = 0;
    pk->depth++;
}

void gp_pickle_dict(gp_pickle *pk)
{
    open_container(pk, 'd');
}

void gp_pickle_list(gp_pickle *pk)
{
    open_container(pk, 'l');
}

void gp_pickle_tuple(gp_pickle *pk)
{
    open_container(pk, 't');
}

void gp_pickle_close(gp_pickle *pk)
{
    if (pk->depth == 0) {
        pk->misuse = true;
        return;
    }
    pk->depth--;
    char kind = pk->open[pk->depth];
    if (kind == 'd' && pk->items[pk->depth] % 2 != 0)
        pk->misuse = true; /* a key without its value */
    put_byte(pk, kind == 'd' ? OP_SETITEMS : kind == 'l' ? OP_APPENDS : OP_TUPLE);
}

void gp_pickle_int(gp_pickle *pk, int64_t v)
{
    count_value(pk);
    if (v >= 0 && v < 256) {
        put_byte(pk, OP_BININT1);
        put_byte(pk, (unsigned char)v);
    } else if (v >= 0 && v < 65536) {
        put_byte(pk, OP_BININT2);
        put_le(pk, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        put_byte(pk, OP_BININT);
        put_le(pk, (uint64_t)v, 4);
    } else { /* LONG1: little-endian two's complement, 8 bytes are enough for any int64 */
        put_byte(pk, OP_LONG1);
        put_byte(pk, 8);
        put_le(pk, (uint64_t)v, 8);
    }
}

void gp_pickle_uint(gp_pickle *pk, uint64_t v)
{
    if (v <= INT64_MAX) {
        gp_pickle_int(pk, (int64_t)v);
        return;
    }
    /* above INT64_MAX: 9 bytes, the last one 0 so that the sign stays positive */
    count_value(pk);
    put_byte(pk, OP_LONG1);
    put_byte(pk, 9);
    put_le(pk, v, 8);
    put_byte(pk, 0);
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_sequence(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0; /* overlong, out of range, or a surrogate */
    return len;
}

void gp_pickle_strn(gp_pickle *pk, const char *s, size_t n)
{
    count_value(pk);
    if (n > UINT32_MAX) {
        pk->misuse = true;
        return;
    }
    put_byte(pk, OP_BINUNICODE);
    put_le(pk, n, 4); /* '?' replaces one invalid byte: the length stays n */
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_sequence(u + i, n - i);
        if (k == 0) {
            put_byte(pk, '?');
            i++;
        } else {
            put(pk, u + i, k);
            i += k;
        }
    }
}

void gp_pickle_str(gp_pickle *pk, const char *s)
{
    gp_pickle_strn(pk, s, strlen(s));
}

void gp_pickle_key(gp_pickle *pk, const char *key)
{
    gp_pickle_str(pk, key);
}

void gp_pickle_bool(gp_pickle *pk, bool v)
{
    count_value(pk);
    put_byte(pk, v ? OP_NEWTRUE : OP_NEWFALSE);
}

void gp_pickle_none(gp_pickle *pk)
{
    count_value(pk);
    put_byte(pk, OP_NONE);
}

void gp_pickle_float(gp_pickle *pk, double v)
{
    count_value(pk);
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    unsigned char b[8];
    for (unsigned i = 0; i < 8; i++)
        b[i] = (unsigned char)(bits >> (8 * (7 - i))); /* big-endian */
    put_byte(pk, OP_BINFLOAT);
    put(pk, b, 8);
}

int gp_pickle_finish(gp_pickle *pk, const char **why)
{
    if (pk->depth != 0)
        pk->misuse = true;
    put_byte(pk, OP_STOP);
    if (pk->failed) {
        *why = "out of host memory";
        return -1;
    }
    if (pk->misuse) {
        *why = "containers do not pair up (one left open, a close without an open, a dict key without a "
               "value, nesting deeper than GP_PICKLE_MAX_DEPTH) or a string over 4 GiB";
        return -1;
    }
    return 0;
}
