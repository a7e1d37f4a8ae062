/*
 * relay.h - a TCP relay that delays what passes through it: it listens on
 * one address and port, connects each client on to another, and holds
 * every byte for a set time in each direction before passing it on. It
 * puts a round trip between a loader and its remote workers on one host
 * (there is no netem here): ferry-bench --compare-remote --rtt-ms, and
 * test_remote with a delay that changes mid-run.
 *
 * One thread per relay, polling its listener and every connection.
 * Bandwidth is whatever copying through the thread allows; up to 64 MiB
 * wait in each direction of a connection before it stops reading.
 */
#ifndef FERRY_TOOLS_BENCH_RELAY_H
#define FERRY_TOOLS_BENCH_RELAY_H

#include <stddef.h>

typedef struct bench_relay bench_relay;

/* Listens on listen_ip:listen_port and relays to to_ip:to_port, delay_us
 * each way. 0, or -1 with errno set. */
int bench_relay_start(bench_relay **out, const char *listen_ip, int listen_port,
                      const char *to_ip, int to_port, unsigned delay_us);

/* The delay each way from now on (bytes already held keep theirs). */
void bench_relay_set_delay(bench_relay *r, unsigned delay_us);

/* From now on, tap(arg, bytes, len) sees every read of bytes passing
 * through, either way, on the relay's thread, before the delay (a test
 * looks at what crosses the wire). Set it before traffic starts. */
void bench_relay_tap(bench_relay *r, void (*tap)(void *arg, const void *data, size_t len),
                     void *arg);

/* Closes every connection and the listener, and joins the thread. */
void bench_relay_stop(bench_relay *r);

#endif
