/*
 * cli.h — the subcommands of the `gpupool` program (main.c dispatches to them).
 */
#ifndef GP_CLI_H
#define GP_CLI_H

/* Each takes argv with argv[0] the subcommand's name and returns the process exit status
 * (0 success, 1 failure, 2 usage error). */
int gp_cmd_replay(int argc, char **argv);
int gp_cmd_demo(int argc, char **argv);
int gp_cmd_plan(int argc, char **argv);
/* cmd_ledger.c: the per-GPU ledger */
int gp_cmd_budget(int argc, char **argv);
int gp_cmd_top(int argc, char **argv);
int gp_cmd_exporter(int argc, char **argv);
int gp_cmd_ledger(int argc, char **argv);

#endif /* GP_CLI_H */
