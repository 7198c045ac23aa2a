/*
 * plan_svg.c — what the memory is made of, drawn as one stacked bar per scale (see plan.h): the four
 * parts of plan_compose.c bottom to top, a y axis in bytes, a legend. Written with stdio, no library.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/format.h"
#include "plan.h"

#define WIDTH 860.0
#define HEIGHT 460.0
#define LEFT 90.0
#define RIGHT 260.0 /* the legend */
#define TOP 50.0
#define BOTTOM 50.0

static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else
            fputc(*s, f);
    }
}

int gp_plan_svg(const char *path, const char *title, const char *const *labels,
                const uint64_t (*parts)[GP_PARTS], size_t columns, char *err, size_t errlen)
{
    static const char *const colors[GP_PARTS] = {"#1f77b4", "#9467bd", "#ff7f0e", "#d62728"};
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        snprintf(err, errlen, "--svg %s: %s", path, strerror(errno));
        return -1;
    }
    double top = 1;
    for (size_t c = 0; c < columns; c++) {
        double sum = 0;
        for (int p = 0; p < GP_PARTS; p++)
            sum += (double)parts[c][p];
        top = sum > top ? sum : top;
    }
    /* a power of two of bytes per grid line (labels such as 128 MiB, 1 GiB), at most 8 of them */
    double step = pow(2, floor(log2(top / 5)));
    while (top / step > 8)
        step *= 2;
    double ymax = ceil(top / step) * step;
    double plot_w = WIDTH - LEFT - RIGHT, plot_h = HEIGHT - TOP - BOTTOM;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", WIDTH, HEIGHT);
    fprintf(f, "<text x=\"%.0f\" y=\"28\" font-size=\"15\">", LEFT);
    put_escaped(f, title);
    fputs("</text>\n", f);
    for (int tick = 0; (double)tick * step <= ymax + step / 2; tick++) {
        double y = (double)tick * step;
        double py = TOP + plot_h - y / ymax * plot_h;
        char a[GP_SIZE_TEXT_MAX];
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", LEFT, py, LEFT + plot_w, py);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", LEFT - 6, py + 4,
                gp_format_size((size_t)y, a));
    }
    double slot = plot_w / (double)(columns ? columns : 1);
    for (size_t c = 0; c < columns; c++) {
        double x = LEFT + slot * (double)c + slot * 0.2, w = slot * 0.6, base = 0;
        for (int p = 0; p < GP_PARTS; p++) {
            double h = (double)parts[c][p] / ymax * plot_h;
            double y = TOP + plot_h - base - h;
            char a[GP_SIZE_TEXT_MAX];
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>%s: %s</title></rect>\n",
                    x, y, w, h, colors[p], gp_part_name(p), gp_format_size(parts[c][p], a));
            base += h;
        }
        char total[GP_SIZE_TEXT_MAX];
        uint64_t sum = 0;
        for (int p = 0; p < GP_PARTS; p++)
            sum += parts[c][p];
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x + w / 2,
                TOP + plot_h - base - 6, gp_format_size(sum, total));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", x + w / 2, TOP + plot_h + 18);
        put_escaped(f, labels[c]);
        fputs("</text>\n", f);
    }
    for (int p = GP_PARTS - 1; p >= 0; p--) {
        double y = TOP + 20.0 * (GP_PARTS - 1 - p);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", WIDTH - RIGHT + 16, y, colors[p]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", WIDTH - RIGHT + 36, y + 11, gp_part_name(p));
    }
    fputs("</svg>\n", f);
    if (fclose(f) != 0) {
        snprintf(err, errlen, "--svg %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
