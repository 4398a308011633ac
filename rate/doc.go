// Package rate limits how often something starts, across every process that
// shares a Redis: a Gate admits at most n starts in any window of length
// per ("at most 100 calls per second to the partner API"). Wait queues first
// come, first served, and sleeps in Redis; Allow never waits and says when
// to retry. It runs on the machinery of package redsem's semaphores and
// shares their prefix, name encoding and error values; redsem.NewGate
// combines a Gate with a semaphore to cap calls in flight too.
//
// A Gate takes only this package's options (Option): a semaphore's, such as
// redsem.WithTTL, has no meaning here and does not compile.
//
// # Keys
//
// All under the name's hash tag, so a gate lives in one Redis Cluster slot,
// the slot of a semaphore of the same name, and never on one of its keys:
//
//	<prefix>{<name>}:rate:meta     hash: n, per, epoch, last grant, timer
//	<prefix>{<name>}:rate:tokens   list: free start tokens
//	<prefix>{<name>}:rate:leases   zset: token -> return time (µs, Redis TIME)
//	<prefix>{<name>}:rate:holders  hash: token -> grant, acquisition -> token
//	<prefix>{<name>}:rate:queue    list: waiting acquisitions, oldest first
//	<prefix>{<name>}:rate:waits    zset: waiter liveness deadlines, tombstones
//	<prefix>{<name>}:rate:in:<id>  list: a waiter's doorbell
//
// The layout and the scripts are those of the rate gate that lived in the
// redsem package in v0.1.0 (redsem.NewRateGate), which this package
// replaces: clients built before and after the move share a gate.
package rate
