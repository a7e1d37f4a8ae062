/*
 * report.c - ferry-bench's output: the one-screen summary, the JSON
 * object, the per-batch CSV and its plot (see bench.h).
 *
 * The summary of one run lays its figures out by what they mean (waits,
 * startup, throughput, memory); a comparison, or several rounds, is a
 * table with one column per side, each cell the median over the rounds
 * [min..max], and a ratio column per side against the first. The JSON has
 * every setting and every figure of every round, so a result can be
 * reproduced and re-read without this program.
 */
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

extern char **environ;

static const char *const ratio_meaning =
    "per round, the first side's figure against the other's, so that > 1 means the first side "
    "did better: other / first for waits and startup (times under 0.01 ms counted as 0.01 ms), "
    "first / other for rates; then the median, min and max over the rounds";

/* ------------------------------------------------------------------------
 * Numbers as text
 */

/* A value with as many decimals as its size wants; "-" for NAN. */
static const char *fmt_value(char *buf, size_t cap, double v, char format)
{
    double a = fabs(v);
    if (isnan(v))
        snprintf(buf, cap, "-");
    else if (format == '%')
        snprintf(buf, cap, "%.1f%%", v * 100);
    else if (format == 'c' || a >= 100)
        snprintf(buf, cap, "%.0f", v);
    else if (a >= 10)
        snprintf(buf, cap, "%.1f", v);
    else if (a >= 1)
        snprintf(buf, cap, "%.2f", v);
    else if (a >= 0.01)
        snprintf(buf, cap, "%.3f", v);
    else if (a == 0)
        snprintf(buf, cap, "0");
    else if (a >= 0.0001)
        snprintf(buf, cap, "%.4f", v);
    else
        snprintf(buf, cap, "<0.0001"); /* a ready batch's next(), in ms: no wait */
    return buf;
}

static const char *fmt_ratio(char *buf, size_t cap, double v)
{
    if (isnan(v))
        snprintf(buf, cap, "-");
    else if (v >= 100)
        snprintf(buf, cap, "%.0fx", v);
    else if (v >= 10)
        snprintf(buf, cap, "%.1fx", v);
    else
        snprintf(buf, cap, "%.2fx", v);
    return buf;
}

/* ------------------------------------------------------------------------
 * The summary
 */

/* "s" unless n is 1: "1 epoch", "2 epochs". */
static const char *plural(long n)
{
    return n == 1 ? "" : "s";
}

void bench_print_settings(const bench_opts *o, long prefetch_n, uint64_t batches_per_epoch, FILE *f)
{
    char prefetch[32] = "auto";
    if (prefetch_n > 0)
        snprintf(prefetch, sizeof prefetch, "%ld", prefetch_n);
    fprintf(f, "ferry-bench %s: %s\n", ferry_version(), o->dataset);
    fprintf(f, "  %ld %s worker%s%s, batch %ld, %llu batches/epoch, ", o->workers, o->worker_mode,
            plural(o->workers), o->bind ? " + remote" : "", o->batch_size,
            (unsigned long long)batches_per_epoch);
    if (o->batches > 0)
        fprintf(f, "%ld batch%s", o->batches, o->batches == 1 ? "" : "es");
    else
        fprintf(f, "%ld epoch%s", o->epochs, plural(o->epochs));
    fprintf(f, ", prefetch %s, %s", prefetch, o->in_order ? "in order" : "out of order");
    if (o->seed >= 0)
        fprintf(f, ", shuffled (seed %ld)", o->seed);
    fputc('\n', f);
    if (o->step_ms > 0)
        fprintf(f, "  step: %g ms %s after each batch (step-bound rate %.0f batches/s)", o->step_ms,
                o->step_sleep ? "sleep" : "busy spin", 1e3 / o->step_ms);
    else
        fprintf(f, "  step: none (the trainer takes batches as fast as they come)");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    fprintf(f, "; host: %ld core%s\n", cores, plural(cores));
    for (int i = 0; i < o->nset; i++)
        fprintf(f, "%s%s%s", i ? ", " : "  loader options set: ", o->set[i],
                i + 1 == o->nset ? "\n" : "");
}

/* One run, laid out by meaning. */
/* Where the time went (ferry_loader_profile): each stage's mean and p99
 * per batch, then the verdict. */
static void print_profile(const ferry_profile *p, const ferry_verdict *v, FILE *f)
{
    fprintf(f, "  stages (ms)         ");
    for (int k = 0; k < FERRY_STAGE_COUNT; k++) {
        const ferry_profile_stage *s = &p->stage[k];
        if (k == FERRY_STAGE_WAIT)
            fprintf(f, "\n                      trainer: ");
        fprintf(f, "%s%s %.3f (p99 %.3f)", k && k != FERRY_STAGE_WAIT ? ", " : "",
                ferry_stage_name(k),
                s->count ? (double)s->sum_ns / (double)s->count / 1e6 : 0.0,
                (double)ferry_profile_quantile(s, 0.99) / 1e6);
    }
    fprintf(f, "\n  verdict             %s\n", v->text);
}

static void print_one(const bench_report *rep, FILE *f)
{
    const bench_fig *x = &rep->figs[0];
    const bench_opts *o = rep->o;
    char a[32], b[32], c[32], d[32];
    bench_print_settings(rep->o, rep->sides[0].prefetch, rep->batches_per_epoch, f);
    if (rep->sides[0].epoch_barrier)
        fprintf(f, "  epoch_barrier on: %s\n", rep->sides[0].what);
    fprintf(f, "\n  wait in next() (ms)        p50        p99        max    batches\n");
    fprintf(f, "  steady               %10s %10s %10s %10.0f\n",
            fmt_value(a, sizeof a, x->wait_p50_ms, 'v'),
            fmt_value(b, sizeof b, x->wait_p99_ms, 'v'),
            fmt_value(c, sizeof c, x->wait_max_ms, 'v'), x->batches - x->epochs);
    fprintf(f, "  epoch start          %10s %10s %10s %10.0f\n",
            fmt_value(a, sizeof a, x->epoch_wait_p50_ms, 'v'),
            fmt_value(b, sizeof b, x->epoch_wait_p99_ms, 'v'),
            fmt_value(c, sizeof c, x->epoch_wait_max_ms, 'v'), x->epochs - 1);
    fprintf(f, "  waited in all       %s ms, %s of the time from first batch to last\n",
            fmt_value(a, sizeof a, x->wait_total_ms, 'v'),
            fmt_value(b, sizeof b, x->wait_share, '%'));
    fprintf(f, "  startup             %s ms: open %s ms, then %s ms to the first batch\n",
            fmt_value(a, sizeof a, x->startup_ms, 'v'), fmt_value(b, sizeof b, x->open_ms, 'v'),
            fmt_value(c, sizeof c, x->startup_ms - x->open_ms, 'v'));
    fprintf(f, "  throughput          %s batches/s, %s items/s, %s MB/s\n",
            fmt_value(a, sizeof a, x->batches_per_s, 'v'),
            fmt_value(b, sizeof b, x->items_per_s, 'c'), fmt_value(c, sizeof c, x->mb_per_s, 'v'));
    if (o->step_ms > 0)
        fprintf(f,
                "  step-bound rate     %s achieved (%s of %.0f batches/s); the step ran "
                "%s ms over on average\n",
                fmt_value(a, sizeof a, x->step_bound_fraction, '%'),
                fmt_value(b, sizeof b, x->batches_per_s, 'v'), 1e3 / o->step_ms,
                fmt_value(c, sizeof c, x->step_overrun_ms, 'v'));
    fprintf(f, "  peak memory (MiB)   trainer RSS %s, PSS %s; ",
            fmt_value(a, sizeof a, x->trainer_peak_rss_mib, 'v'),
            fmt_value(b, sizeof b, x->trainer_peak_pss_mib, 'v'));
    if (rep->last->worker_processes > 0)
        fprintf(f, "%d worker processes RSS %s, PSS %s (sums)\n", rep->last->worker_processes,
                fmt_value(c, sizeof c, x->workers_peak_rss_mib, 'v'),
                fmt_value(d, sizeof d, x->workers_peak_pss_mib, 'v'));
    else
        fprintf(f, "no local worker processes (threads are in the trainer's)\n");
    if (isnan(x->make_p50_ms))
        fprintf(f, "  batch times         not reported by this libferry (make, flight, ready)\n");
    else
        fprintf(f, "  batch times p50     make %s ms, flight %s ms, ready %s ms\n",
                fmt_value(a, sizeof a, x->make_p50_ms, 'v'),
                fmt_value(b, sizeof b, x->flight_p50_ms, 'v'),
                fmt_value(c, sizeof c, x->ready_p50_ms, 'v'));
    print_profile(&rep->last->profile, &rep->last->verdict, f);
    if (x->failed > 0 || x->retried > 0)
        fprintf(f, "  trouble             %.0f batches failed, %.0f sent to another worker\n",
                x->failed, x->retried);
    if (!rep->last->hwm_reset)
        fprintf(f, "  (the kernel refused to reset VmHWM: the trainer's peak RSS may be older)\n");
}

/* One cell: the median, with [min..max] when there is room and more than
 * one round. */
static void cell(char *buf, size_t cap, const bench_summary *s, const bench_metric *m, int spread,
                 int ratio)
{
    char a[24], b[24], c[24];
    double med = bench_get(&s->median, m), lo = bench_get(&s->min, m), hi = bench_get(&s->max, m);
    if (ratio) {
        fmt_ratio(a, sizeof a, med);
        fmt_ratio(b, sizeof b, lo);
        fmt_ratio(c, sizeof c, hi);
    } else {
        fmt_value(a, sizeof a, med, m->format);
        fmt_value(b, sizeof b, lo, m->format);
        fmt_value(c, sizeof c, hi, m->format);
    }
    if (spread && !isnan(med) && m->format != 'c')
        snprintf(buf, cap, "%s [%s..%s]", a, b, c);
    else
        snprintf(buf, cap, "%s", a);
}

/* What flow control chose in each side's last run (docs/remote.md,
 * "Latency"): the credits, the window, why, and the round trip. */
static void print_flow(const bench_report *rep, FILE *f)
{
    if (!rep->side_stats)
        return;
    fprintf(f, "\nflow control at the end of each side's last run:\n");
    for (size_t k = 0; k < rep->nsides; k++) {
        const ferry_stats *st = &rep->side_stats[k];
        fprintf(f, "  %-14s credits %u..%u (%s), window %u (%s), round trip %.1f ms\n",
                rep->sides[k].name, st->credits_min, st->credits, ferry_sized_name((int)st->credits_why),
                st->prefetch, ferry_sized_name((int)st->prefetch_why), st->round_trip_us / 1000.0);
    }
}

/* Sides and rounds: one column per side, then the ratios. */
static void print_table(const bench_report *rep, FILE *f)
{
    int spread = rep->rounds > 1;
    int side_spread = spread && rep->nsides <= 2;
    int wide = side_spread ? 24 : 14;
    bench_print_settings(rep->o, rep->sides[0].prefetch, rep->batches_per_epoch, f);
    for (size_t k = 0; k < rep->nsides; k++)
        fprintf(f, "  %c = %s: %s\n", (int)('A' + k), rep->sides[k].name, rep->sides[k].what);
    if (rep->nsides > 1 && rep->rounds > 1)
        fprintf(f, "  %zu rounds, alternating (A B%s A B ...), in this one invocation\n",
                rep->rounds, rep->nsides > 2 ? " C" : "");
    fprintf(f, "\n%-30s", spread ? "median [min..max] of rounds" : "one round");
    for (size_t k = 0; k < rep->nsides; k++)
        fprintf(f, "%*s", wide, rep->sides[k].name);
    for (size_t k = 1; k < rep->nsides; k++) {
        char head[48];
        snprintf(head, sizeof head, "A vs %c", (int)('A' + k));
        fprintf(f, "%*s", spread ? 22 : 10, head);
    }
    fputc('\n', f);
    for (size_t i = 0; i < bench_nmetrics; i++) {
        const bench_metric *m = &bench_metrics[i];
        int any = 0;
        for (size_t k = 0; k < rep->nsides; k++)
            any |= !isnan(bench_get(&rep->per_side[k].median, m));
        if (!m->format || !any)
            continue;
        char buf[80];
        fprintf(f, "%-30s", m->label);
        for (size_t k = 0; k < rep->nsides; k++) {
            cell(buf, sizeof buf, &rep->per_side[k], m, side_spread, 0);
            fprintf(f, "%*s", wide, buf);
        }
        for (size_t k = 1; k < rep->nsides && m->better; k++) {
            cell(buf, sizeof buf, &rep->ratios[k], m, spread, 1);
            fprintf(f, "%*s", spread ? 22 : 10, buf);
        }
        fputc('\n', f);
    }
    if (rep->nsides > 1)
        fprintf(f,
                "\nA vs %s: > 1 means A did better: per round, %s / A for waits and startup\n"
                "(under 0.01 ms counted as 0.01 ms), A / %s for rates.\n",
                rep->nsides > 2 ? "X" : "B", rep->nsides > 2 ? "X" : "B",
                rep->nsides > 2 ? "X" : "B");
    fprintf(f, "wait = time in next(); steady = all batches but each epoch's first; epoch start = "
               "the first\nbatch of epochs 1.. (epoch 0's is in startup); see ferry-bench --help "
               "for the rest.\n");
    if (rep->o->compare_remote)
        print_flow(rep, f);
}

void bench_print_text(const bench_report *rep, FILE *f)
{
    if (rep->nsides == 1 && rep->rounds == 1)
        print_one(rep, f);
    else
        print_table(rep, f);
}

/* ------------------------------------------------------------------------
 * JSON
 */

void bench_json_str(FILE *f, const char *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

void bench_json_num(FILE *f, double v)
{
    if (isnan(v) || isinf(v))
        fputs("null", f);
    else
        fprintf(f, "%.10g", v);
}

/* The figures of f as an object; only those with a ratio when `ratios`. */
static void json_figs(FILE *out, const bench_fig *f, int ratios)
{
    const char *sep = "";
    fputc('{', out);
    for (size_t i = 0; i < bench_nmetrics; i++) {
        const bench_metric *m = &bench_metrics[i];
        if (ratios && !m->better)
            continue;
        fprintf(out, "%s\"%s\": ", sep, m->key);
        bench_json_num(out, bench_get(f, m));
        sep = ", ";
    }
    fputc('}', out);
}

static void json_summary(FILE *f, const bench_summary *s, int ratios)
{
    fputs("{\"median\": ", f);
    json_figs(f, &s->median, ratios);
    fputs(", \"min\": ", f);
    json_figs(f, &s->min, ratios);
    fputs(", \"max\": ", f);
    json_figs(f, &s->max, ratios);
}

void bench_json_settings(const bench_opts *o, size_t rounds, FILE *f)
{
    fputs("{\"dataset\": ", f);
    bench_json_str(f, o->dataset);
    fputs(", \"worker_mode\": ", f);
    bench_json_str(f, o->worker_mode);
    fprintf(f,
            ", \"workers\": %ld, \"batch_size\": %ld, \"prefetch\": %ld, \"epochs\": %ld, "
            "\"batches\": %ld, ",
            o->workers, o->batch_size, o->prefetch, o->batches > 0 ? 0 : o->epochs, o->batches);
    if (o->seed >= 0)
        fprintf(f, "\"seed\": %ld, \"shuffle\": true, ", o->seed);
    else
        fputs("\"seed\": null, \"shuffle\": false, ", f);
    fprintf(f, "\"in_order\": %s, \"epoch_barrier\": %s, \"step_ms\": ",
            o->in_order ? "true" : "false", o->epoch_barrier ? "true" : "false");
    bench_json_num(f, o->step_ms);
    fprintf(f,
            ", \"step_mode\": \"%s\", \"rounds\": %zu, \"compare\": %s, "
            "\"compare_remote\": %s, \"limits\": %s, \"prefetch_factor\": %ld, \"bind\": ",
            o->step_sleep ? "sleep" : "spin", rounds, o->compare ? "true" : "false",
            o->compare_remote ? "true" : "false", o->limits ? "true" : "false", o->prefetch_factor);
    bench_json_str(f, o->bind);
    fprintf(f,
            ", \"min_workers\": %ld, \"insecure\": %s, \"io_threads\": %ld, \"shm\": %s, "
            "\"worker_path\": ",
            o->min_workers, o->insecure ? "true" : "false", o->io_threads,
            o->no_shm ? "false" : "true");
    bench_json_str(f, o->worker_path);
    fputs(", \"csv\": ", f);
    bench_json_str(f, o->csv);
    fputs(", \"plot\": ", f);
    bench_json_str(f, o->plot);
    fputs(", \"set\": [", f);
    for (int i = 0; i < o->nset; i++) {
        if (i)
            fputs(", ", f);
        bench_json_str(f, o->set[i]);
    }
    fputs("]}", f);
}

void bench_json_host(FILE *f)
{
    char host[256] = "";
    struct utsname u;
    double load[3] = {NAN, NAN, NAN};
    gethostname(host, sizeof host - 1);
    int have_uname = uname(&u) == 0;
    getloadavg(load, 3);
    fprintf(f, "{\"cores\": %ld, \"hostname\": ", sysconf(_SC_NPROCESSORS_ONLN));
    bench_json_str(f, host);
    fputs(", \"kernel\": ", f);
    bench_json_str(f, have_uname ? u.release : NULL);
    fputs(", \"loadavg_1m_at_end\": ", f);
    bench_json_num(f, load[0]);
    fputc('}', f);
}

void bench_print_json(const bench_report *rep, FILE *f)
{
    fputs("{\"tool\": \"ferry-bench\", \"version\": ", f);
    bench_json_str(f, ferry_version());
    fputs(", \"settings\": ", f);
    bench_json_settings(rep->o, rep->rounds, f);
    fputs(", \"host\": ", f);
    bench_json_host(f);
    fprintf(f, ", \"batches_per_epoch\": %llu, \"sides\": [",
            (unsigned long long)rep->batches_per_epoch);
    for (size_t k = 0; k < rep->nsides; k++) {
        const bench_side *s = &rep->sides[k];
        fprintf(f, "%s{\"name\": ", k ? ", " : "");
        bench_json_str(f, s->name);
        fputs(", \"what\": ", f);
        bench_json_str(f, s->what);
        fprintf(f, ", \"epoch_barrier\": %s, \"prefetch\": %ld",
                s->epoch_barrier ? "true" : "false", s->prefetch);
        if (rep->side_stats) {
            const ferry_stats *st = &rep->side_stats[k];
            fprintf(f,
                    ", \"flow\": {\"credits_min\": %u, \"credits\": %u, \"credits_why\": \"%s\", "
                    "\"window\": %u, \"window_why\": \"%s\", \"round_trip_us\": %u}",
                    st->credits_min, st->credits, ferry_sized_name((int)st->credits_why),
                    st->prefetch, ferry_sized_name((int)st->prefetch_why), st->round_trip_us);
        }
        fputc('}', f);
    }
    fputs("], \"results\": {", f);
    for (size_t k = 0; k < rep->nsides; k++) {
        fprintf(f, "%s\"%s\": ", k ? ", " : "", rep->sides[k].name);
        json_summary(f, &rep->per_side[k], 0);
        fputs(", \"rounds\": [", f);
        for (size_t r = 0; r < rep->rounds; r++) {
            fputs(r ? ", " : "", f);
            json_figs(f, &rep->figs[r * rep->nsides + k], 0);
        }
        fputs("]}", f);
    }
    fputc('}', f);
    if (rep->nsides > 1) {
        fputs(", \"ratio_meaning\": ", f);
        bench_json_str(f, ratio_meaning);
        fputs(", \"ratios\": {", f);
        for (size_t k = 1; k < rep->nsides; k++) {
            fprintf(f, "%s\"%s\": ", k > 1 ? ", " : "", rep->sides[k].name);
            json_summary(f, &rep->ratios[k], 1);
            fputc('}', f);
        }
        fputc('}', f);
    }
    fputs("}\n", f);
}

/* ------------------------------------------------------------------------
 * CSV
 */

void bench_csv_header(FILE *f, int labelled)
{
    fprintf(f, "%sseq,epoch,batch_in_epoch,worker,wait_us,make_us,flight_us,ready_us,attempts\n",
            labelled ? "round,side," : "");
}

void bench_csv_rows(FILE *f, const bench_run *r, int labelled, size_t round, const char *side)
{
    for (size_t i = 0; i < r->nrecs; i++) {
        const bench_rec *x = &r->recs[i];
        if (labelled)
            fprintf(f, "%zu,%s,", round, side);
        fprintf(f, "%llu,%llu,%llu,%u,%.3f,%.3f,%.3f,%.3f,%u\n", (unsigned long long)x->seq,
                (unsigned long long)x->epoch, (unsigned long long)x->batch_in_epoch, x->worker,
                (double)x->wait_ns / 1e3, (double)x->make_ns / 1e3, (double)x->flight_ns / 1e3,
                (double)x->ready_ns / 1e3, x->attempts);
    }
}

/* ------------------------------------------------------------------------
 * The plot
 */

/* s as a gnuplot single-quoted string (a quote inside is doubled). */
static void gp_str(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* The gnuplot program: one series of points per side (its last round),
 * each epoch's first batch circled, a dashed line where each epoch starts.
 * The CSV's columns are numbered from 1; labelled rows have two more. */
static void write_gnuplot(FILE *f, const bench_report *rep, const char *csv, const char *png)
{
    const bench_opts *o = rep->o;
    int shift = rep->labelled ? 2 : 0;
    int seq = 1 + shift, epoch = 2 + shift, in_epoch = 3 + shift, wait = 5 + shift;
    fputs("if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
          "    set terminal pngcairo size 1200,560 font ',10'\n"
          "} else {\n"
          "    set terminal png size 1200,560\n"
          "}\n"
          "set output ",
          f);
    gp_str(f, png);
    fputs("\nset datafile separator ','\nset title ", f);
    char title[512];
    snprintf(title, sizeof title, "ferry-bench %s: %s, %ld %s worker%s, batch %ld, step %g ms %s%s",
             ferry_version(), o->dataset, o->workers, o->worker_mode, plural(o->workers),
             o->batch_size, o->step_ms, o->step_sleep ? "sleep" : "spin",
             rep->rounds > 1 ? " (last round)" : "");
    gp_str(f, title);
    fputs(" noenhanced\n"
          "set xlabel 'batch (seq, across epochs; dashed: an epoch starts; circled: its first "
          "batch)' noenhanced\n"
          "set ylabel \"the trainer's wait in next() (ms, log scale)\" noenhanced\n"
          "set logscale y\nset grid ytics\nset key top right\n"
          "atleast(x) = x < 1e-4 ? 1e-4 : x  # 0 and sub-0.1 us waits drawn at 0.1 us\n",
          f);
    uint64_t bpe = rep->batches_per_epoch, batches = (uint64_t)rep->figs[0].batches;
    for (uint64_t s = bpe; bpe && s < batches; s += bpe)
        fprintf(f, "set arrow from %llu, graph 0 to %llu, graph 1 nohead dt 2 lc rgb '#999999'\n",
                (unsigned long long)s, (unsigned long long)s);
    fputs("plot ", f);
    for (size_t k = 0; k < rep->nsides; k++) {
        for (int circled = 0; circled < 2; circled++) {
            char sel[200] = "1";
            int n = 1; /* the circled selection goes on after "1" */
            if (shift)
                n = snprintf(sel, sizeof sel, "column(1) == %zu && strcol(2) eq '%s'", rep->rounds,
                             rep->sides[k].name);
            if (circled)
                snprintf(sel + n, sizeof sel - (size_t)n, " && column(%d) > 0 && column(%d) == 0",
                         epoch, in_epoch);
            fputs(k || circled ? ", \\\n     " : "", f);
            gp_str(f, csv);
            fprintf(
                f,
                " skip 1 using %d:((%s) ? atleast(column(%d) / 1000.0) : NaN) with points lc %zu "
                "pt %d ps %s title '%s%s' noenhanced",
                seq, sel, wait, k + 1, circled ? 6 : 7, circled ? "1.5" : "0.5", rep->sides[k].name,
                circled ? ", epoch start" : "");
        }
    }
    fputc('\n', f);
}

int bench_plot(const bench_report *rep, const char *csv_path, const char *png_path)
{
    const char *tmp = getenv("TMPDIR");
    char script[4096];
    snprintf(script, sizeof script, "%s/ferry-bench-plot-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(script);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "ferry-bench: --plot: cannot write a gnuplot script in %s: %s\n",
                tmp && *tmp ? tmp : "/tmp", strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(script);
        }
        return 1;
    }
    write_gnuplot(f, rep, csv_path, png_path);
    int werr = fclose(f) != 0;
    /* gnuplot's own output goes to stderr: stdout may be carrying JSON. */
    pid_t pid;
    char *argv[] = {"gnuplot", script, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    int e = werr ? EIO : posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    int st = 0;
    if (!e) {
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
    }
    unlink(script);
    if (e == ENOENT) {
        fprintf(stderr, "ferry-bench: --plot needs gnuplot, which is not installed (Debian: "
                        "apt-get install gnuplot-nox); no plot made\n");
        return 1;
    }
    if (e) {
        fprintf(stderr, "ferry-bench: --plot: cannot run gnuplot: %s\n", strerror(e));
        return 1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr,
                "ferry-bench: --plot: gnuplot failed (see its message above); no plot "
                "in %s\n",
                png_path);
        return 1;
    }
    return 0;
}
