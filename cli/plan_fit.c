/*
 * plan_fit.c — peak live bytes as a polynomial in the scale: fixed + linear, or fixed + linear +
 * quadratic when three or more scales are given (attention scores grow with the square of a sequence
 * length). Least squares over the given points, solved from the normal equations with x divided by its
 * largest value (so the 3x3 system stays well conditioned) and Gaussian elimination with partial
 * pivoting. The error reported is relative to each measured value; with more points than terms the
 * leave-one-out error (each point predicted from the others) says how well the fit extrapolates.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan.h"

/* Solves the terms x terms system m * c = v in place; false when singular. */
static int solve(double m[3][3], double v[3], int terms, double c[3])
{
    for (int col = 0; col < terms; col++) {
        int pivot = col;
        for (int r = col + 1; r < terms; r++)
            if (fabs(m[r][col]) > fabs(m[pivot][col]))
                pivot = r;
        if (fabs(m[pivot][col]) < 1e-12)
            return 0;
        for (int k = 0; k < terms; k++) {
            double t = m[col][k];
            m[col][k] = m[pivot][k];
            m[pivot][k] = t;
        }
        double t = v[col];
        v[col] = v[pivot];
        v[pivot] = t;
        for (int r = col + 1; r < terms; r++) {
            double f = m[r][col] / m[col][col];
            for (int k = col; k < terms; k++)
                m[r][k] -= f * m[col][k];
            v[r] -= f * v[col];
        }
    }
    for (int r = terms - 1; r >= 0; r--) {
        double s = v[r];
        for (int k = r + 1; k < terms; k++)
            s -= m[r][k] * c[k];
        c[r] = s / m[r][r];
    }
    return 1;
}

/* Least squares of the points not equal to `skip` (skip = n: none skipped). */
static int least_squares(const double *x, const double *y, size_t n, size_t skip, int terms, double c[3])
{
    double xmax = 0;
    for (size_t i = 0; i < n; i++)
        if (i != skip && x[i] > xmax)
            xmax = x[i];
    double m[3][3] = {{0}}, v[3] = {0};
    for (size_t i = 0; i < n; i++) {
        if (i == skip)
            continue;
        double u = x[i] / xmax, p[3] = {1.0, u, u * u};
        for (int r = 0; r < terms; r++) {
            for (int k = 0; k < terms; k++)
                m[r][k] += p[r] * p[k];
            v[r] += p[r] * y[i];
        }
    }
    double cu[3] = {0};
    if (!solve(m, v, terms, cu))
        return 0;
    c[0] = cu[0];
    c[1] = cu[1] / xmax;
    c[2] = terms > 2 ? cu[2] / (xmax * xmax) : 0.0;
    return 1;
}

double gp_fit_eval(const gp_scale_fit *fit, double x)
{
    return fit->fixed + fit->linear * x + fit->quadratic * x * x;
}

int gp_fit_scale(const double *x, const double *y, size_t n, int terms, gp_scale_fit *fit, char *err,
                 size_t errlen)
{
    memset(fit, 0, sizeof *fit);
    if (terms < 2 || terms > 3 || n < (size_t)terms) {
        snprintf(err, errlen, "a fit with %d terms needs at least %d points, not %zu", terms, terms < 2 ? 2 : terms, n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (!(x[i] > 0)) {
            snprintf(err, errlen, "scale %g: a scale must be above 0", x[i]);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (x[i] == x[j]) {
                snprintf(err, errlen, "scale %g is given twice", x[i]);
                return -1;
            }
    }
    double c[3] = {0};
    if (!least_squares(x, y, n, n, terms, c)) {
        snprintf(err, errlen, "the fit is singular");
        return -1;
    }
    fit->terms = terms;
    fit->points = n;
    fit->fixed = c[0];
    fit->linear = c[1];
    fit->quadratic = c[2];
    for (size_t i = 0; i < n; i++) {
        double e = y[i] != 0 ? fabs(gp_fit_eval(fit, x[i]) - y[i]) / fabs(y[i]) : 0.0;
        if (e > fit->max_rel_error)
            fit->max_rel_error = e;
    }
    fit->loo_max_rel_error = -1.0;
    if (n >= 3) {
        int loo_terms = (size_t)terms <= n - 1 ? terms : (int)(n - 1);
        fit->loo_max_rel_error = 0.0;
        for (size_t skip = 0; skip < n; skip++) {
            double d[3] = {0};
            if (!least_squares(x, y, n, skip, loo_terms, d))
                continue;
            gp_scale_fit other = {.fixed = d[0], .linear = d[1], .quadratic = d[2]};
            double e = y[skip] != 0 ? fabs(gp_fit_eval(&other, x[skip]) - y[skip]) / fabs(y[skip]) : 0.0;
            if (e > fit->loo_max_rel_error)
                fit->loo_max_rel_error = e;
        }
    }
    return 0;
}
