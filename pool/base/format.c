/*
 * format.c — sizes as text: bytes below 1 KiB, otherwise one decimal in the largest binary unit; and
 * strings quoted and escaped for JSON.
 */
#include "base/format.h"

#include <stdio.h>

const char *gp_format_size(size_t bytes, char *buf)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, GP_SIZE_TEXT_MAX, "%zu B", bytes);
        return buf;
    }
    double value = (double)bytes / 1024.0;
    size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < sizeof units / sizeof units[0]) {
        value /= 1024.0;
        unit++;
    }
    snprintf(buf, GP_SIZE_TEXT_MAX, "%.1f %s", value, units[unit]);
    return buf;
}

/* The length of the UTF-8 sequence at s (1-4), or 0 when it is not a well-formed one. */
static size_t utf8_length(const unsigned char *s)
{
    size_t n = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return n;
}

size_t gp_format_json_string(char *out, size_t cap, const char *s)
{
    size_t used = 0;
#define EMIT(text, n)                                                                                          \
    do {                                                                                                       \
        for (size_t k_ = 0; k_ < (n); k_++, used++)                                                            \
            if (used + 1 < cap)                                                                                \
                out[used] = (text)[k_];                                                                        \
    } while (0)
    EMIT("\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c != '\0';) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*c;
            EMIT(esc, 2);
            c++;
        } else if (*c == '\t' || *c == '\n' || *c == '\r') {
            esc[0] = '\\';
            esc[1] = *c == '\t' ? 't' : *c == '\n' ? 'n' : 'r';
            EMIT(esc, 2);
            c++;
        } else if (*c < 0x20 || *c == 0x7f) {
            snprintf(esc, sizeof esc, "\\u%04x", *c);
            EMIT(esc, 6);
            c++;
        } else if (*c < 0x80) {
            EMIT((const char *)c, 1);
            c++;
        } else {
            size_t n = utf8_length(c);
            if (n == 0) {
                EMIT("\\ufffd", 6);
                c++;
            } else {
                EMIT((const char *)c, n);
                c += n;
            }
        }
    }
    EMIT("\"", 1);
#undef EMIT
    if (cap > 0)
        out[used < cap ? used : cap - 1] = '\0';
    return used;
}
