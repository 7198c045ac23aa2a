/*
 * replay_models.h — several traces as several tenants on one simulated GPU (replay_models.c).
 */
#ifndef GP_CLI_REPLAY_MODELS_H
#define GP_CLI_REPLAY_MODELS_H

/* Replays specs NAME=TRACE[:max=SIZE][:high=SIZE][:min=SIZE] together; prints a table (or one JSON
 * object with a "tenants" array). With `snapshot` (NULL = none) the pool records its history and a
 * memory_viz snapshot is written there at the end, before what the traces left live is freed (each
 * model's name in the frames). `processes`: each model in a process of its own against one ledger
 * (see replay_models.c). `speed` > 0: events no sooner than their trace time divided by speed (0 = as
 * fast as possible). Returns the process exit status. */
int gp_replay_models(const char **specs, int count, const char *device_memory, const char *conf, int json,
                     const char *snapshot, unsigned snapshot_flags, int processes, double speed);

#endif /* GP_CLI_REPLAY_MODELS_H */
