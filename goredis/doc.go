// Package goredis lets redsem semaphores, mutexes and rate gates run on a
// github.com/redis/go-redis/v9 client: a *redis.Client, a Sentinel failover
// client (redis.NewFailoverClient) or a *redis.ClusterClient.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	pool, err := goredis.New(rdb)
//	if err != nil { ... }
//	sem, err := redsem.NewSemaphore(pool, "encoder", 2)
//
// It lives in a module of its own, so the redsem module does not depend on
// go-redis. New does no I/O and changes nothing in the client: its options
// (address, password, TLS, pool size, Sentinel discovery) apply unchanged.
//
// # How it runs commands
//
// A Pool hands out redigo connections, which is what redsem speaks. Such a
// connection holds no go-redis connection between commands: each command,
// and each pipeline (the commands sent before a Flush), borrows one
// connection of the client's pool for as long as it runs, pinned with
// Client.Conn, and sends the pipeline in one write. Pinning matters for
// safety, not just for pipelining: go-redis retries a command on another
// connection after some network errors, which could run a non-idempotent
// script twice; a pinned connection never does.
//
// # Replies and errors
//
// Replies take the shapes redigo gives over RESP2, whichever protocol the
// client speaks (go-redis speaks RESP3 unless Options.Protocol is 2): bulk
// and status strings as []byte, integers as int64, arrays as []interface{},
// a nil reply as nil. RESP3 replies are brought back to their RESP2 form (a
// map to a flat array of pairs sorted by key, true to 1, false to nil, a
// double to its text). Error replies become redigo's redis.Error, so redsem
// reports ErrWrongType, ErrSizeMismatch, ErrOutOfMemory and ErrCorrupt as it
// does on redigo, and scripts fall back from EVALSHA to EVAL on NOSCRIPT.
// Script hashes come from Redis (SCRIPT LOAD), never from SHA-1 on the
// client, so a program runs under GODEBUG=fips140=only here too.
// Connection, timeout and context errors pass through unchanged.
//
// # Cancellation
//
// go-redis v9 does not interrupt a read when its context is cancelled. This
// package does not wait for go-redis: each command runs in a goroutine and
// the caller waits for it or for its context, whichever ends first, so a
// cancelled or timed-out Acquire returns within redsem's documented bound
// (250 ms) as it does on redigo, whatever the client's ReadTimeout or
// ContextTimeoutEnabled. The connection the caller gave up on is broken
// (Err returns the context's error) and redsem settles the acquisition on a
// fresh one. The go-redis connection itself is not left blocked: a
// pipeline holding a blocking command (BLMOVE, BLPOP, ...) first asks its
// CLIENT ID, and when its caller gives up, CLIENT UNBLOCK ends the wait at
// once, so the connection reads its last reply and goes back to the pool
// clean. A connection that fails instead is discarded by go-redis. With
// CLIENT UNBLOCK refused (an ACL without it), the connection comes back when
// the blocking command times out (at most redsem's longest block, 30 s).
//
// A blocking pipeline's read deadline is the client's ReadTimeout plus the
// command's own timeout (go-redis would otherwise apply ReadTimeout alone to
// a pipeline, and cut every long wait short).
//
// # Cluster routing
//
// On a ClusterClient, a command goes to the master that serves its key
// (the first key of EVAL and EVALSHA, the first argument of most commands);
// a pipeline goes to the master of its first keyed command. All keys of one
// redsem semaphore share a hash tag, so its pipelined BLMOVE and lease
// script reach one node over one connection. A single command follows MOVED
// and ASK (sending ASKING first) and retries TRYAGAIN, CLUSTERDOWN, LOADING,
// MASTERDOWN, READONLY and UNBLOCKED with backoff, at most 8 times: Redis
// sends these before it runs a command (or as it ends a wait), so following
// them never runs a command twice. Inside
// a pipeline these come back as *cluster.RedirectError (from
// github.com/redsem/redsem/cluster), which is not a redis.Error: redsem then
// treats the wait as broken, settles it on a fresh connection (routed anew)
// and waits again, as it does on the cluster package's own Pool. Commands
// without a key (SCRIPT FLUSH, INFO) go to the master of slot 0.
//
// # Sentinel
//
// A failover client finds the master through the sentinels and moves to the
// new one when it learns of a switch. It does not check a node's role on
// each connection, so right after a failover (while the old master has not
// yet turned replica, or the client has not yet heard) a command can reach
// the old master: a write made there is lost when it turns replica, and a
// Release or Refresh that finds its lease missing on a node mid-resync
// reports ErrLeaseLost although the lease lives on (it expires at its TTL;
// no token is lost). The sentinel package of redsem checks ROLE on every
// new connection and waits out that window; prefer it where this matters.
//
// # Limits
//
// A *redis.Ring and other UniversalClient implementations are refused
// (ErrUnsupportedClient). Each blocking wait costs one more round trip
// (CLIENT ID) than on redigo; uncontended operations cost the same one.
// Status replies such as "OK" come back as []byte, not string; redigo's
// helpers (redis.String and the like) accept both.
package goredis
