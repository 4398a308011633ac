package admin

import "sort"

// aclCommands are the Redis commands redsem needs, lower case. The client
// sends EVALSHA (EVAL when the server answers NOSCRIPT, SCRIPT LOAD for the
// hash of a script's first run in a process) and waits in BLMOVE
// (Acquire, TryAcquire's fast path needs none) and BLPOP (AcquireN, an
// RWMutex's RLock and Lock and a rate gate's Wait sleep on a doorbell); the
// rest are what the scripts in internal/engine/lua/ call.
// TestAdmin_ACLCommands_matchSources derives the same set from the sources and
// fails when they part.
var aclCommands = []string{
	// sent by the client
	"blmove", "blpop", "eval", "evalsha", "script|load",
	// called by the scripts
	"del", "exists",
	"hdel", "hget", "hgetall", "hincrby", "hkeys", "hmget", "hset", "hsetnx",
	"lindex", "llen", "lpop", "lpush", "lrange", "lrem", "rpush",
	"persist", "pexpire", "pexpireat", "time", "type",
	"zadd", "zincrby", "zmscore", "zrange", "zrangebyscore", "zrem", "zscore",
}

// ACLCommands returns the Redis commands redsem sends, lower case and
// sorted. A user allowed exactly these, on the keys "<prefix>*" and no
// channel, can run every operation of package redsem, of package rate and
// of a Handle. Left out: INFO (CheckServer), SCAN (ScanNames, ReadFleet),
// SELECT, and what a pool's TestOnBorrow sends; see docs/acl.md. The list
// grows only with a new version of redsem.
func ACLCommands() []string {
	out := append([]string(nil), aclCommands...)
	sort.Strings(out)
	return out
}
