/*
 * size_class.c — the inverse of gp_size_class (see size_class.h for the scheme).
 */
#include "ds/size_class.h"

size_t gp_size_class_base(unsigned c)
{
    if (c < GP_CLASS_LINEAR)
        return (size_t)c * GP_GRANULE;
    unsigned k = 4 + ((c - GP_CLASS_LINEAR) >> GP_CLASS_SUB_LOG2);
    size_t sub = (c - GP_CLASS_LINEAR) & ((1u << GP_CLASS_SUB_LOG2) - 1);
    size_t granules = ((size_t)1 << k) + sub * ((size_t)1 << (k - GP_CLASS_SUB_LOG2));
    return granules * GP_GRANULE;
}
