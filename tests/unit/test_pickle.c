/*
 * test_pickle.c — the protocol-2 pickle writer (pool/base/pickle.c): the exact opcodes of every kind
 * of value at the edges of each integer encoding, strings (valid UTF-8 kept, invalid bytes written as
 * '?'), nesting, and misuse (unclosed containers, a dict key without a value) refused by finish.
 * That Python's unpicklers load whole documents is checked by python/tests/test_snapshot.py.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "base/pickle.h"

/* The document's bytes between PROTO 2 and STOP. */
static void expect_body(gp_pickle *pk, const void *want, size_t n)
{
    const char *why = NULL;
    cr_assert_eq(gp_pickle_finish(pk, &why), 0, "%s", why ? why : "");
    cr_assert_eq(pk->buf[0], 0x80);
    cr_assert_eq(pk->buf[1], 2);
    cr_assert_eq(pk->buf[pk->len - 1], '.');
    cr_assert_eq(pk->len, n + 3, "body of %zu bytes, want %zu", pk->len - 3, n);
    cr_assert_eq(memcmp(pk->buf + 2, want, n), 0, "the opcodes differ");
    gp_pickle_free(pk);
}

Test(pickle, small_ints_use_the_shortest_opcode)
{
    gp_pickle pk;
    gp_pickle_init(&pk);
    gp_pickle_list(&pk);
    gp_pickle_int(&pk, 0);
    gp_pickle_int(&pk, 255);
    gp_pickle_int(&pk, 256);
    gp_pickle_int(&pk, 65535);
    gp_pickle_int(&pk, 65536);
    gp_pickle_int(&pk, -1);
    gp_pickle_int(&pk, INT32_MAX);
    gp_pickle_int(&pk, INT32_MIN);
    gp_pickle_close(&pk);
    static const unsigned char want[] = {
        ']', '(',
        'K', 0x00,
        'K', 0xff,
        'M', 0x00, 0x01,
        'M', 0xff, 0xff,
        'J', 0x00, 0x00, 0x01, 0x00,
        'J', 0xff, 0xff, 0xff, 0xff,
        'J', 0xff, 0xff, 0xff, 0x7f,
        'J', 0x00, 0x00, 0x00, 0x80,
        'e'};
    expect_body(&pk, want, sizeof want);
}

Test(pickle, large_ints_are_long1_twos_complement)
{
    gp_pickle pk;
    gp_pickle_init(&pk);
    gp_pickle_tuple(&pk);
    gp_pickle_int(&pk, (int64_t)1 << 40);
    gp_pickle_int(&pk, -((int64_t)1 << 40));
    gp_pickle_uint(&pk, 0x7f0000000000ull);
    gp_pickle_uint(&pk, UINT64_MAX);
    gp_pickle_close(&pk);
    static const unsigned char want[] = {
        '(',
        0x8a, 8, 0, 0, 0, 0, 0, 0x01, 0, 0,
        0x8a, 8, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff,
        0x8a, 8, 0, 0, 0, 0, 0, 0x7f, 0, 0,
        0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, /* positive: a 0 byte on top */
        't'};
    expect_body(&pk, want, sizeof want);
}

Test(pickle, strings_bools_none_float_and_dicts)
{
    gp_pickle pk;
    gp_pickle_init(&pk);
    gp_pickle_dict(&pk);
    gp_pickle_key(&pk, "a");
    gp_pickle_bool(&pk, true);
    gp_pickle_key(&pk, "\xc3\xa9"); /* é: valid UTF-8, kept */
    gp_pickle_bool(&pk, false);
    gp_pickle_strn(&pk, "x\xffy", 3); /* an invalid byte becomes '?' */
    gp_pickle_none(&pk);
    gp_pickle_key(&pk, "f");
    gp_pickle_float(&pk, 1.5);
    gp_pickle_close(&pk);
    static const unsigned char want[] = {
        '}', '(',
        'X', 1, 0, 0, 0, 'a', 0x88,
        'X', 2, 0, 0, 0, 0xc3, 0xa9, 0x89,
        'X', 3, 0, 0, 0, 'x', '?', 'y', 'N',
        'X', 1, 0, 0, 0, 'f', 'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0,
        'u'};
    expect_body(&pk, want, sizeof want);
}

Test(pickle, truncated_utf8_sequences_are_replaced_not_read_past)
{
    gp_pickle pk;
    gp_pickle_init(&pk);
    gp_pickle_strn(&pk, "\xe2\x82", 2); /* the first two bytes of a three-byte sequence */
    gp_pickle_strn(&pk, "\xed\xa0\x80", 3); /* a surrogate: not valid UTF-8 */
    gp_pickle_tuple(&pk);
    gp_pickle_close(&pk);
    static const unsigned char want[] = {'X', 2, 0, 0, 0, '?', '?', 'X', 3, 0, 0, 0, '?', '?', '?', '(', 't'};
    expect_body(&pk, want, sizeof want);
}

Test(pickle, misuse_is_refused_at_finish)
{
    const char *why = NULL;
    gp_pickle pk;
    gp_pickle_init(&pk);
    gp_pickle_list(&pk);
    cr_assert_eq(gp_pickle_finish(&pk, &why), -1, "an open list");
    cr_assert_not_null(why);
    gp_pickle_free(&pk);

    gp_pickle_init(&pk);
    gp_pickle_dict(&pk);
    gp_pickle_key(&pk, "key without a value");
    gp_pickle_close(&pk);
    cr_assert_eq(gp_pickle_finish(&pk, &why), -1, "a dict with an odd number of items");
    gp_pickle_free(&pk);

    gp_pickle_init(&pk);
    gp_pickle_close(&pk);
    cr_assert_eq(gp_pickle_finish(&pk, &why), -1, "a close without an open");
    gp_pickle_free(&pk);

    gp_pickle_init(&pk);
    for (int i = 0; i <= GP_PICKLE_MAX_DEPTH; i++)
        gp_pickle_list(&pk);
    for (int i = 0; i <= GP_PICKLE_MAX_DEPTH; i++)
        gp_pickle_close(&pk);
    cr_assert_eq(gp_pickle_finish(&pk, &why), -1, "nesting past GP_PICKLE_MAX_DEPTH");
    gp_pickle_free(&pk);
}

Test(pickle, a_large_document_grows_its_buffer)
{
    gp_pickle pk;
    gp_pickle_init(&pk);
    gp_pickle_list(&pk);
    for (int i = 0; i < 100000; i++)
        gp_pickle_int(&pk, 1000); /* 'M' + 2 bytes each */
    gp_pickle_close(&pk);
    const char *why = NULL;
    cr_assert_eq(gp_pickle_finish(&pk, &why), 0);
    cr_assert_eq(pk.len, 2 + 2 + 3 * 100000 + 1 + 1);
    cr_assert_eq(pk.buf[4], 'M');
    cr_assert_eq(pk.buf[pk.len - 2], 'e');
    gp_pickle_free(&pk);
}
