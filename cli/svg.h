/*
 * svg.h — a small line-chart writer for `gpupool replay --plot` and `gpupool demo`.
 *
 * One SVG file holds one or more panels stacked vertically; each panel has one x axis shared by its
 * series and a y axis in bytes (labelled in KiB, MiB or GiB). Series longer than the panel's width
 * are reduced to one point per bucket holding the bucket's largest value, so peaks stay visible.
 * Written with stdio by the tool itself: no plotting library.
 */
#ifndef GP_CLI_SVG_H
#define GP_CLI_SVG_H

#include <stddef.h>

typedef struct gp_svg_series {
    const char *name;  /* legend text */
    const char *color; /* CSS colour, e.g. "#1f77b4" */
    const double *y;   /* the panel's n values, in bytes */
    int filled;        /* 1: area under the line is filled (translucent) */
    int dashed;        /* 1: dashed line */
} gp_svg_series;

typedef struct gp_svg_panel {
    const char *title;
    const char *x_label;
    const double *x;   /* n increasing values */
    size_t n;
    const gp_svg_series *series;
    size_t num_series;
} gp_svg_panel;

/* Writes the chart to `path`. Returns 0, or -1 with a message in err. */
int gp_svg_write(const char *path, const char *title, const gp_svg_panel *panels, size_t num_panels,
                 char *err, size_t errlen);

#endif /* GP_CLI_SVG_H */
