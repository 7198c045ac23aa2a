/*
 * ledger_view.h — printing a read of the per-GPU ledger: the `gpupool top` table, JSON, and the
 * Prometheus text exposition format (ledger_view.c).
 */
#ifndef GP_CLI_LEDGER_VIEW_H
#define GP_CLI_LEDGER_VIEW_H

#include <stdio.h>

#include "provider/ledger.h"

/* The ledger's name as a device label ("dev0" for /gpupool.dev0). */
const char *gp_ledger_view_device(const gp_ledger_view *v);
void gp_ledger_view_print_table(FILE *f, const gp_ledger_view *v);
void gp_ledger_view_print_json(FILE *f, const gp_ledger_view *v);
void gp_ledger_view_print_prometheus(FILE *f, const gp_ledger_view *v);

#endif /* GP_CLI_LEDGER_VIEW_H */
