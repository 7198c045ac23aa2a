/*
 * svg.c — writes line charts of bytes over events or time as SVG (see svg.h).
 */
#define _POSIX_C_SOURCE 200809L
#include "svg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SVG_WIDTH 960.0
#define PANEL_HEIGHT 300.0
#define MARGIN_LEFT 84.0
#define MARGIN_RIGHT 24.0
#define MARGIN_TOP 44.0     /* panel title */
#define MARGIN_BOTTOM 44.0  /* x tick labels and axis label */
#define TITLE_HEIGHT 36.0
#define MAX_POINTS 1200u    /* points per series after bucketing */

static void put_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* The largest "nice" step (1, 2 or 5 times a power of ten) giving at most `ticks` intervals. */
static double nice_step(double range, int ticks)
{
    if (range <= 0)
        return 1.0;
    double raw = range / ticks;
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    double step = f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0;
    return step * mag;
}

static void format_tick(char *buf, size_t len, double v)
{
    if (fabs(v - round(v)) < 1e-9)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%g", v);
}

/* One panel with its top at y0. */
static void write_panel(FILE *f, const gp_svg_panel *p, double y0)
{
    double plot_x0 = MARGIN_LEFT, plot_x1 = SVG_WIDTH - MARGIN_RIGHT;
    double plot_y0 = y0 + MARGIN_TOP, plot_y1 = y0 + PANEL_HEIGHT - MARGIN_BOTTOM;
    double xmin = p->n ? p->x[0] : 0.0, xmax = p->n ? p->x[p->n - 1] : 1.0;
    if (xmax <= xmin)
        xmax = xmin + 1.0;
    double ymax = 0.0;
    for (size_t s = 0; s < p->num_series; s++)
        for (size_t i = 0; i < p->n; i++)
            if (p->series[s].y[i] > ymax)
                ymax = p->series[s].y[i];
    const char *unit = "bytes";
    double scale = 1.0;
    if (ymax >= 1024.0 * 1024.0 * 1024.0) {
        unit = "GiB";
        scale = 1024.0 * 1024.0 * 1024.0;
    } else if (ymax >= 1024.0 * 1024.0) {
        unit = "MiB";
        scale = 1024.0 * 1024.0;
    } else if (ymax >= 1024.0) {
        unit = "KiB";
        scale = 1024.0;
    }
    double ystep = nice_step(ymax / scale * 1.05, 5);
    double ytop = ceil(ymax / scale * 1.05 / ystep) * ystep;
    if (ytop <= 0)
        ytop = ystep;

    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"ptitle\">", plot_x0, y0 + 26.0);
    put_escaped(f, p->title);
    fputs("</text>\n", f);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"frame\"/>\n", plot_x0,
            plot_y0, plot_x1 - plot_x0, plot_y1 - plot_y0);

    /* y grid and labels */
    for (int tick = 0; (double)tick * ystep <= ytop + ystep * 0.01; tick++) {
        double v = (double)tick * ystep;
        double y = plot_y1 - (v / ytop) * (plot_y1 - plot_y0);
        char label[32];
        format_tick(label, sizeof label, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>\n", plot_x0, y,
                plot_x1, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"ytick\">%s %s</text>\n", plot_x0 - 6.0, y + 4.0,
                label, unit);
    }
    /* x ticks */
    double xstep = nice_step(xmax - xmin, 8);
    double xfirst = ceil(xmin / xstep) * xstep;
    for (int tick = 0; xfirst + (double)tick * xstep <= xmax + xstep * 0.01; tick++) {
        double v = xfirst + (double)tick * xstep;
        double x = plot_x0 + (v - xmin) / (xmax - xmin) * (plot_x1 - plot_x0);
        char label[32];
        format_tick(label, sizeof label, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>\n", x, plot_y0, x,
                plot_y1);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"xtick\">%s</text>\n", x, plot_y1 + 16.0, label);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"xlabel\">", (plot_x0 + plot_x1) / 2.0, plot_y1 + 34.0);
    put_escaped(f, p->x_label);
    fputs("</text>\n", f);

    /* series, bucketed to at most MAX_POINTS points holding each bucket's maximum */
    size_t buckets = p->n < MAX_POINTS ? p->n : MAX_POINTS;
    for (size_t s = 0; s < p->num_series; s++) {
        const gp_svg_series *se = &p->series[s];
        if (buckets == 0)
            break;
        if (se->filled) {
            fprintf(f, "<path fill=\"%s\" fill-opacity=\"0.25\" stroke=\"none\" d=\"M%.1f %.1f", se->color,
                    plot_x0 + (p->x[0] - xmin) / (xmax - xmin) * (plot_x1 - plot_x0), plot_y1);
        } else {
            fprintf(f, "<path fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"%s d=\"", se->color,
                    se->dashed ? " stroke-dasharray=\"6 4\"" : "");
        }
        double last_x = 0.0;
        for (size_t b = 0; b < buckets; b++) {
            size_t lo = b * p->n / buckets, hi = (b + 1) * p->n / buckets;
            double y = se->y[lo];
            for (size_t i = lo + 1; i < hi; i++)
                if (se->y[i] > y)
                    y = se->y[i];
            double px = plot_x0 + (p->x[lo] - xmin) / (xmax - xmin) * (plot_x1 - plot_x0);
            double py = plot_y1 - (y / scale / ytop) * (plot_y1 - plot_y0);
            fprintf(f, "%s%.1f %.1f", (b == 0 && !se->filled) ? "M" : " L", px, py);
            last_x = px;
        }
        if (se->filled)
            fprintf(f, " L%.1f %.1f Z", last_x, plot_y1);
        fputs("\"/>\n", f);
    }
    /* legend */
    double ly = plot_y0 + 16.0;
    for (size_t s = 0; s < p->num_series; s++) {
        const gp_svg_series *se = &p->series[s];
        double lx = plot_x0 + 12.0;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%s\"%s/>\n",
                lx, ly - 4.0, lx + 22.0, ly - 4.0, se->color, se->filled ? "8" : "2",
                se->dashed ? " stroke-dasharray=\"6 4\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" class=\"legend\">", lx + 28.0, ly);
        put_escaped(f, se->name);
        fputs("</text>\n", f);
        ly += 16.0;
    }
}

int gp_svg_write(const char *path, const char *title, const gp_svg_panel *panels, size_t num_panels,
                 char *err, size_t errlen)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, errlen, "%s: cannot open for writing: %s", path, strerror(errno));
        return -1;
    }
    double height = TITLE_HEIGHT + PANEL_HEIGHT * (double)num_panels + 8.0;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">\n"
            "<style>\n"
            "text { font-family: sans-serif; fill: #222; }\n"
            ".title { font-size: 17px; font-weight: bold; }\n"
            ".ptitle { font-size: 14px; font-weight: bold; }\n"
            ".ytick { font-size: 11px; text-anchor: end; }\n"
            ".xtick { font-size: 11px; text-anchor: middle; }\n"
            ".xlabel { font-size: 12px; text-anchor: middle; }\n"
            ".legend { font-size: 12px; }\n"
            ".frame { fill: none; stroke: #888; }\n"
            ".grid { stroke: #ddd; stroke-width: 1; }\n"
            "</style>\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            SVG_WIDTH, height, SVG_WIDTH, height);
    fprintf(f, "<text x=\"%.1f\" y=\"24\" class=\"title\">", MARGIN_LEFT);
    put_escaped(f, title);
    fputs("</text>\n", f);
    for (size_t i = 0; i < num_panels; i++)
        write_panel(f, &panels[i], TITLE_HEIGHT + PANEL_HEIGHT * (double)i);
    fputs("</svg>\n", f);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno ? errno : EIO));
        return -1;
    }
    return 0;
}
