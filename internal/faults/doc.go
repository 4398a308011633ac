// Package faults is redsem's fault and bad-input suite: it drives real client
// processes (the worker program in ./worker, built by the tests) against real
// redis-server processes on loopback, injects faults (kill -9, SIGSTOP,
// CLIENT KILL, context-cancellation storms, server restarts and stalls, rogue
// writers, memory pressure), and checks the history the clients record with
// the checker in ./history. Its tests also run that checker against
// deliberately broken clients to show that it catches them.
//
// A worker can run several goroutines on one *Semaphore (-goroutines), so
// that they share waiting behind the process's pumps; each is a holder of
// its own in the history (pid and goroutine index). It can take k permits
// per hold with AcquireN (-weighted "1,2,3": k drawn from the set); the
// history records the k tokens of such a hold and the checker counts a
// k-hold as k permits.
//
// With -names K a worker spreads its holds over K semaphores (-idle sets
// WithIdleExpiry); its events carry the name, and TestIdleExpiryChurn checks
// each name's history across the epochs its expiries make.
//
// Rate gates have a worker of their own (./rateworker): its goroutines
// take starts of mixed sizes from a rate.Quota and record each grant's
// Redis time and units; the tests change the limits meanwhile and hold the
// history to the limits in force with redistest.CheckWindows, which they
// also run against broken gates.
//
// Elections have a worker of their own too (./electworker): it campaigns,
// writes to a fenced resource while it leads (checking Leadership.Valid
// first) and logs each step; TestElectionKillAndStopLeaders kills and stops
// its leaders and holds the log, and a slow observer's view, to the
// election's invariants.
//
// Set REDSEM_SOAK=1 to run every fault for longer.
package faults
