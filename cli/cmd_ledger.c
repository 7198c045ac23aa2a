/*
 * cmd_ledger.c — the commands over the per-GPU ledger (pool/provider/ledger.h):
 *   gpupool budget [--device N | --ledger NAME] [TENANT max=SIZE high=SIZE min=SIZE]   set / list budgets
 *   gpupool top [--device N | --ledger NAME] [--once] [--json]                        live view
 *   gpupool exporter [--device N | --ledger NAME] [--listen ADDR:PORT] [--port-file F] [--scrapes N]
 *   gpupool ledger [--device N | --ledger NAME] --remove                              remove the object
 * top and exporter map the ledger read-only and never take its lock: they cannot stall or change the
 * processes they watch. The exporter serves one connection at a time; each scrape reads the ledger
 * once (bounded: GP_LEDGER_POOLS x GP_LEDGER_TENANTS entries) and makes no device call.
 */
#define _DEFAULT_SOURCE /* usleep */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "cli.h"
#include "base/config.h"
#include "base/error.h"
#include "base/format.h"
#include "gpupool.h"
#include "backend/backend.h"
#include "provider/ledger.h"
#include "provider/pool_ledger.h"
#include "ledger_view.h"

typedef struct ledger_args {
    char shm_name[GP_LEDGER_NAME_MAX];
    int once, json, remove, scrapes;
    const char *listen, *port_file;
    int first_free; /* index of the first argument that is not an option */
} ledger_args;

/* The ledger to use: --ledger NAME, else --device N, else GPUPOOL_CONF's ledger key, else device 0. */
static int parse_args(const char *cmd, int argc, char **argv, ledger_args *a)
{
    memset(a, 0, sizeof *a);
    a->listen = "127.0.0.1:9464";
    const char *name = NULL;
    int device = -1;
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (arg[0] != '-')
            break;
        if (strcmp(arg, "--once") == 0) {
            a->once = 1;
        } else if (strcmp(arg, "--json") == 0) {
            a->json = 1;
        } else if (strcmp(arg, "--remove") == 0) {
            a->remove = 1;
        } else if (i + 1 < argc && strcmp(arg, "--ledger") == 0) {
            name = argv[++i];
        } else if (i + 1 < argc && strcmp(arg, "--device") == 0) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end != '\0' || n < 0 || n > 1024) {
                fprintf(stderr, "gpupool %s: --device %s: expected a device number\n", cmd, argv[i]);
                return 2;
            }
            device = (int)n;
        } else if (i + 1 < argc && strcmp(arg, "--listen") == 0) {
            a->listen = argv[++i];
        } else if (i + 1 < argc && strcmp(arg, "--port-file") == 0) {
            a->port_file = argv[++i];
        } else if (i + 1 < argc && strcmp(arg, "--scrapes") == 0) {
            char *end = NULL;
            long n = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end != '\0' || n < 0 || n > 1000000000) {
                fprintf(stderr, "gpupool %s: --scrapes %s: expected a count from 0 up\n", cmd, argv[i]);
                return 2;
            }
            a->scrapes = (int)n;
        } else {
            fprintf(stderr, "gpupool %s: unknown option %s (try gpupool %s --help)\n", cmd, arg, cmd);
            return 2;
        }
    }
    a->first_free = i;
    int rc;
    if (name != NULL) {
        rc = gp_ledger_shm_name(name, 0, NULL, a->shm_name);
    } else {
        /* the ledger a pool of GPUPOOL_CONF would use: device N's own (named by its UUID, which the
         * configured backend is asked for: pool_ledger.h) with --device, else GPUPOOL_CONF's ledger, else
         * device 0's own */
        gp_config cfg;
        gp_config_defaults(&cfg);
        const char *env = getenv("GPUPOOL_CONF");
        if (env != NULL && gp_config_apply(&cfg, env, "GPUPOOL_CONF") != GP_OK) {
            fprintf(stderr, "gpupool %s: %s\n", cmd, gp_last_error());
            return 2;
        }
        if (device >= 0 || strcmp(cfg.ledger, "off") == 0)
            strcpy(cfg.ledger, "on");
        const gp_backend_ops *ops = gp_backend_find(cfg.backend);
        rc = ops == NULL ? GP_ERR_BACKEND
                         : gp_pool_ledger_name(&cfg, ops, NULL, device >= 0 ? device : 0, a->shm_name);
    }
    if (rc != GP_OK) {
        fprintf(stderr, "gpupool %s: %s\n", cmd, gp_last_error());
        return 2;
    }
    return 0;
}

static const char budget_usage[] =
    "usage: gpupool budget [--device N | --ledger NAME] [TENANT [max=SIZE] [high=SIZE] [min=SIZE]]\n"
    "\n"
    "Sets GPU-wide limits of TENANT in the ledger of device N (default: GPUPOOL_CONF's ledger, else device\n"
    "0): every process's pool on that GPU counts the tenant's memory together against them. SIZE 0 or\n"
    "none removes a limit. Without TENANT, lists the budgets. The ledger must exist (a pool made it).\n"
    "A device's ledger is named by its UUID, which GPUPOOL_CONF's backend (cuda by default) is asked for.\n";

int gp_cmd_budget(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0))
        return fputs(budget_usage, stdout), 0;
    ledger_args a;
    int st = parse_args("budget", argc, argv, &a);
    if (st != 0)
        return st;
    gp_ledger *l;
    if (gp_ledger_open(&l, a.shm_name, 0) != GP_OK) {
        fprintf(stderr, "gpupool budget: %s\n", gp_last_error());
        return 1;
    }
    int status = 0;
    if (a.first_free < argc) {
        const char *tenant = argv[a.first_free];
        uint64_t v[3] = {0, 0, 0};
        unsigned which = 0;
        static const char *const keys[] = {"max=", "high=", "min="};
        for (int i = a.first_free + 1; i < argc && status == 0; i++) {
            int k = 0;
            while (k < 3 && strncmp(argv[i], keys[k], strlen(keys[k])) != 0)
                k++;
            size_t bytes = 0;
            const char *value = k < 3 ? argv[i] + strlen(keys[k]) : "";
            if (k == 3 || (strcmp(value, "none") != 0 && !gp_parse_size(value, &bytes))) {
                fprintf(stderr, "gpupool budget: '%s' is not max=SIZE, high=SIZE or min=SIZE\n", argv[i]);
                status = 2;
                break;
            }
            v[k] = bytes;
            which |= 1u << k;
        }
        if (status == 0 && which == 0) {
            fprintf(stderr, "gpupool budget: %s: give max=SIZE, high=SIZE and/or min=SIZE\n", tenant);
            status = 2;
        }
        if (status == 0 && gp_ledger_set_budget(l, tenant, v[0], v[1], v[2], which) != GP_OK) {
            fprintf(stderr, "gpupool budget: %s\n", gp_last_error());
            status = 1;
        }
    }
    if (status == 0) {
        gp_ledger_view *v = malloc(sizeof *v);
        if (v != NULL && gp_ledger_view_read(l, v, true) == GP_OK) {
            char x[GP_SIZE_TEXT_MAX], y[GP_SIZE_TEXT_MAX], z[GP_SIZE_TEXT_MAX], w[GP_SIZE_TEXT_MAX];
            printf("%-16s %10s %10s %10s %10s   (ledger %s)\n", "TENANT", "MAX", "HIGH", "MIN", "HELD", v->name);
            for (unsigned t = 0; t < v->num_tenants; t++)
                if (v->tenants[t].name[0] != '\0')
                    printf("%-16s %10s %10s %10s %10s\n", v->tenants[t].name,
                           v->tenants[t].max ? gp_format_size((size_t)v->tenants[t].max, x) : "-",
                           v->tenants[t].high ? gp_format_size((size_t)v->tenants[t].high, y) : "-",
                           v->tenants[t].min ? gp_format_size((size_t)v->tenants[t].min, z) : "-",
                           gp_format_size((size_t)v->tenants[t].held, w));
        }
        free(v);
    }
    gp_ledger_close(l);
    return status;
}

static const char top_usage[] =
    "usage: gpupool top [--device N | --ledger NAME] [--once] [--json]\n"
    "\n"
    "Shows every process and tenant on the GPU from its ledger: held (device memory charged), live,\n"
    "cached, peak, budgets, refusals, OOMs and device calls, refreshed every second (Ctrl-C stops it).\n"
    "Read-only: the processes are not touched. --once prints one view and exits; --json prints it as\n"
    "one JSON object.\n";

static volatile sig_atomic_t stop_requested;

static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

int gp_cmd_top(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0))
        return fputs(top_usage, stdout), 0;
    ledger_args a;
    int st = parse_args("top", argc, argv, &a);
    if (st != 0)
        return st;
    if (a.first_free < argc) {
        fprintf(stderr, "gpupool top: unexpected argument %s\n", argv[a.first_free]);
        return 2;
    }
    gp_ledger *l;
    if (gp_ledger_open_readonly(&l, a.shm_name) != GP_OK) {
        fprintf(stderr, "gpupool top: %s\n", gp_last_error());
        return 1;
    }
    gp_ledger_view *v = malloc(sizeof *v);
    if (v == NULL) {
        gp_ledger_close(l);
        return 1;
    }
    signal(SIGINT, on_stop);
    signal(SIGTERM, on_stop);
    do {
        gp_ledger_view_read(l, v, false);
        if (!a.once)
            fputs("\033[H\033[2J", stdout); /* home, clear */
        if (a.json)
            gp_ledger_view_print_json(stdout, v);
        else
            gp_ledger_view_print_table(stdout, v);
        fflush(stdout);
        for (int i = 0; i < 10 && !a.once && !stop_requested; i++)
            usleep(100000);
    } while (!a.once && !stop_requested);
    free(v);
    gp_ledger_close(l);
    return 0;
}

static const char exporter_usage[] =
    "usage: gpupool exporter [--device N | --ledger NAME] [--listen ADDR:PORT] [--port-file FILE]\n"
    "                        [--scrapes N]\n"
    "\n"
    "Serves the ledger's figures at http://ADDR:PORT/metrics in Prometheus's text exposition format\n"
    "(default 127.0.0.1:9464; port 0 picks a free one, written to --port-file). Read-only, one\n"
    "connection at a time, no device call. --scrapes N exits after N requests of /metrics.\n";

/* Reads the request head (bounded, with a timeout); returns the request target or NULL. */
static const char *read_request(int fd, char *buf, size_t cap)
{
    size_t used = 0;
    while (used < cap - 1) {
        ssize_t n = recv(fd, buf + used, cap - 1 - used, 0);
        if (n <= 0)
            break;
        used += (size_t)n;
        buf[used] = '\0';
        if (strstr(buf, "\r\n\r\n") != NULL || strstr(buf, "\n\n") != NULL)
            break;
    }
    buf[used] = '\0';
    if (strncmp(buf, "GET ", 4) != 0)
        return NULL;
    char *target = buf + 4, *end = strchr(target, ' ');
    if (end == NULL)
        return NULL;
    *end = '\0';
    return target;
}

static void send_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n <= 0)
            return;
        data += n;
        len -= (size_t)n;
    }
}

static void respond(int fd, const char *status, const char *type, const char *body, size_t len)
{
    char head[256];
    int n = snprintf(head, sizeof head, "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, type, len);
    send_all(fd, head, (size_t)n);
    send_all(fd, body, len);
}

int gp_cmd_exporter(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0))
        return fputs(exporter_usage, stdout), 0;
    ledger_args a;
    int st = parse_args("exporter", argc, argv, &a);
    if (st != 0)
        return st;
    char host[64];
    const char *colon = strrchr(a.listen, ':');
    if (colon == NULL || (size_t)(colon - a.listen) >= sizeof host) {
        fprintf(stderr, "gpupool exporter: --listen %s: expected ADDR:PORT\n", a.listen);
        return 2;
    }
    memcpy(host, a.listen, (size_t)(colon - a.listen));
    host[colon - a.listen] = '\0';
    char *port_end = NULL;
    long port = strtol(colon + 1, &port_end, 10);
    if (port_end == colon + 1 || *port_end != '\0' || port < 0 || port > 65535) {
        fprintf(stderr, "gpupool exporter: --listen %s: '%s' is not a port (0 to 65535)\n", a.listen, colon + 1);
        return 2;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        fprintf(stderr, "gpupool exporter: --listen %s: '%s' is not an IPv4 address\n", a.listen, host);
        return 2;
    }
    gp_ledger *l;
    if (gp_ledger_open_readonly(&l, a.shm_name) != GP_OK) {
        fprintf(stderr, "gpupool exporter: %s\n", gp_last_error());
        return 1;
    }
    int sock = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t alen = sizeof addr;
    if (sock < 0 || bind(sock, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(sock, 16) != 0 ||
        getsockname(sock, (struct sockaddr *)&addr, &alen) != 0) {
        fprintf(stderr, "gpupool exporter: cannot listen on %s: %s\n", a.listen, strerror(errno));
        gp_ledger_close(l);
        return 1;
    }
    if (a.port_file != NULL) {
        FILE *pf = fopen(a.port_file, "w");
        if (pf != NULL) {
            fprintf(pf, "%u\n", ntohs(addr.sin_port));
            fclose(pf);
        }
    }
    fprintf(stderr, "gpupool exporter: ledger %s at http://%s:%u/metrics\n", a.shm_name, host, ntohs(addr.sin_port));
    struct sigaction sa = {.sa_handler = on_stop}; /* no SA_RESTART: accept returns on a signal */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    gp_ledger_view *v = malloc(sizeof *v);
    int served = 0;
    while (v != NULL && !stop_requested && (a.scrapes <= 0 || served < a.scrapes)) {
        int fd = accept(sock, NULL, NULL);
        if (fd < 0)
            continue;
        struct timeval tv = {2, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char req[4096];
        const char *target = read_request(fd, req, sizeof req);
        if (target != NULL && (strcmp(target, "/metrics") == 0 || strncmp(target, "/metrics?", 9) == 0)) {
            char *body = NULL;
            size_t len = 0;
            FILE *mem = open_memstream(&body, &len);
            gp_ledger_view_read(l, v, false);
            gp_ledger_view_print_prometheus(mem, v);
            fclose(mem);
            respond(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body, len);
            free(body);
            served++;
        } else if (target != NULL && strcmp(target, "/") == 0) {
            static const char page[] = "gpupool exporter: see /metrics\n";
            respond(fd, "200 OK", "text/plain; charset=utf-8", page, sizeof page - 1);
        } else {
            static const char page[] = "not found: the figures are at /metrics\n";
            respond(fd, "404 Not Found", "text/plain; charset=utf-8", page, sizeof page - 1);
        }
        close(fd);
    }
    free(v);
    close(sock);
    gp_ledger_close(l);
    return 0;
}

static const char ledger_usage[] =
    "usage: gpupool ledger [--device N | --ledger NAME] --remove\n"
    "\n"
    "Removes the ledger's shared-memory object (e.g. one of an older layout version). Pools attached\n"
    "to it keep their mapping; pools made afterwards make a new one.\n";

int gp_cmd_ledger(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0))
        return fputs(ledger_usage, stdout), 0;
    ledger_args a;
    int st = parse_args("ledger", argc, argv, &a);
    if (st != 0)
        return st;
    if (!a.remove) {
        fputs(ledger_usage, stderr);
        return 2;
    }
    if (gp_ledger_unlink(a.shm_name) != GP_OK) {
        fprintf(stderr, "gpupool ledger: %s\n", gp_last_error());
        return 1;
    }
    printf("removed %s\n", a.shm_name);
    return 0;
}
