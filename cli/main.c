/*
 * main.c — the `gpupool` program: `gpupool demo`, `gpupool replay TRACE...`, the ledger commands
 * (budget, top, exporter, ledger), `gpupool help`.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gpupool.h"

static const char usage[] =
    "usage: gpupool COMMAND [ARGS]\n"
    "\n"
    "  demo           three synthetic model workloads (a transformer training step, a CNN inference\n"
    "                 loop and a bursty serving loop) sharing one simulated GPU; prints a table per\n"
    "                 model and for the pool, and writes demo.svg. Needs no GPU and no files.\n"
    "  replay TRACE.. replays allocation traces (RMM CSV logs) on the simulated GPU and reports peak\n"
    "                 reserved over peak live, device calls and host time per event\n"
    "  plan ...       how much device memory a model needs at a batch size or sequence length it was\n"
    "                 not traced at, what that memory is made of, and which models fit on one GPU\n"
    "  budget NAME max=SIZE min=SIZE\n"
    "                 GPU-wide budget of a tenant in the ledger shared by every process on a GPU\n"
    "  top [--once] [--json]\n"
    "                 every process and tenant on the GPU from its ledger, refreshed every second\n"
    "  exporter [--listen 127.0.0.1:9464]\n"
    "                 the ledger's figures at /metrics in Prometheus's text format\n"
    "  ledger --remove  removes a ledger (e.g. one of an older layout)\n"
    "  help [config]  this text, or the pool's configuration keys (GPUPOOL_CONF / --conf)\n"
    "  version        the library version\n"
    "\n"
    "`gpupool COMMAND --help` describes a command's options.\n";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage, stdout);
        return 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "replay") == 0)
        return gp_cmd_replay(argc - 1, argv + 1);
    if (strcmp(cmd, "demo") == 0)
        return gp_cmd_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0)
        return gp_cmd_plan(argc - 1, argv + 1);
    if (strcmp(cmd, "budget") == 0)
        return gp_cmd_budget(argc - 1, argv + 1);
    if (strcmp(cmd, "top") == 0)
        return gp_cmd_top(argc - 1, argv + 1);
    if (strcmp(cmd, "exporter") == 0)
        return gp_cmd_exporter(argc - 1, argv + 1);
    if (strcmp(cmd, "ledger") == 0)
        return gp_cmd_ledger(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        if (argc > 2 && strcmp(argv[2], "config") == 0)
            fputs(gp_config_help(), stdout);
        else if (argc > 2 && strcmp(argv[2], "replay") == 0)
            return gp_cmd_replay(2, (char *[]){"replay", "--help", NULL});
        else if (argc > 2 && strcmp(argv[2], "plan") == 0)
            return gp_cmd_plan(2, (char *[]){"plan", "--help", NULL});
        else if (argc > 2 && strcmp(argv[2], "demo") == 0)
            return gp_cmd_demo(2, (char *[]){"demo", "--help", NULL});
        else
            fputs(usage, stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("gpupool %d.%d.%d\n", GPUPOOL_VERSION_MAJOR, GPUPOOL_VERSION_MINOR, GPUPOOL_VERSION_PATCH);
        return 0;
    }
    fprintf(stderr, "gpupool: unknown command \"%s\"\n\n%s", cmd, usage);
    return 2;
}
