/*
 * plan_traces.h — builds small traces in memory for the plan tests (a text in RMM's CSV, parsed by the
 * real reader).
 */
#ifndef GP_TEST_PLAN_TRACES_H
#define GP_TEST_PLAN_TRACES_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

typedef struct trace_text {
    char *text;
    size_t len, cap;
    unsigned long time;
} trace_text;

static inline void tt_line(trace_text *t, const char *action, unsigned long ptr, unsigned long long size)
{
    if (t->cap - t->len < 128) {
        t->cap = t->cap ? t->cap * 2 : 4096;
        t->text = realloc(t->text, t->cap);
        cr_assert_not_null(t->text);
        if (t->len == 0)
            t->len = (size_t)snprintf(t->text, t->cap, "Thread,Time,Action,Pointer,Size,Stream\n");
    }
    t->len += (size_t)snprintf(t->text + t->len, t->cap - t->len, "0,%lu,%s,0x%lx,%llu,0x0\n", ++t->time, action,
                               ptr, size);
}

static inline void tt_alloc(trace_text *t, unsigned long ptr, unsigned long long size)
{
    tt_line(t, "allocate", ptr, size);
}

static inline void tt_free(trace_text *t, unsigned long ptr, unsigned long long size)
{
    tt_line(t, "free", ptr, size);
}

static inline void tt_parse(trace_text *t, const char *name, gp_trace *out)
{
    char err[512];
    if (t->len == 0)
        tt_line(t, "allocate failure", 1, 1); /* header only is not tested here */
    cr_assert_eq(gp_trace_parse(out, name, t->text, t->len, err, sizeof err), 0, "%s", err);
    free(t->text);
    memset(t, 0, sizeof *t);
}

#endif /* GP_TEST_PLAN_TRACES_H */
