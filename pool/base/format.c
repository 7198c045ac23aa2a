/*
 * format.c — sizes as text: bytes below 1 KiB, otherwise one decimal in the largest binary unit.
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
