package redsem

import "sort"

// aclCommands are the Redis commands redsem needs, lower case. The client
// sends EVALSHA (EVAL when the server answers NOSCRIPT) and waits in BLMOVE
// (Acquire, TryAcquire's fast path needs none) and BLPOP (AcquireN, an
// RWMutex's RLock and Lock and a rate gate's Wait sleep on a doorbell); the rest are what the scripts in
// internal/engine/lua/ call. TestACLCommandsMatchSources derives the same set from the sources
// and fails when they part.
var aclCommands = []string{
	// sent by the client
	"blmove", "blpop", "eval", "evalsha",
	// called by the scripts
	"del", "exists",
	"hdel", "hget", "hgetall", "hincrby", "hkeys", "hmget", "hset", "hsetnx",
	"lindex", "llen", "lpop", "lpush", "lrange", "lrem", "rpush",
	"persist", "pexpire", "pexpireat", "time", "type",
	"zadd", "zincrby", "zmscore", "zrange", "zrangebyscore", "zrem", "zscore",
}

// ACLCommands returns the Redis commands redsem sends, lower case and
// sorted: the ones the client sends itself and the ones its scripts call.
// A Redis user allowed exactly these commands, on the keys under the prefix
// ("~redsem:*" for the default prefix) and no pub/sub channel, can run every
// operation of Semaphore, Mutex, RWMutex, Lease, Admin, Gate and of package
// rate:
//
//	ACL SETUSER redsem-app on >secret resetkeys ~redsem:* resetchannels -@all +blmove +blpop ...
//
// It leaves out what only some setups need: INFO, which CheckServer reads
// (without it CheckServer returns nil, as it cannot tell); SCAN, which only
// the fleet view (ScanNames, ReadFleet, redsem top and the exporter) sends
// to find names; SELECT, which a
// pool that dials a database other than 0 sends; and whatever a pool's own
// TestOnBorrow sends (often PING). AUTH needs no permission. The list grows
// only with a new version of redsem; compare it after an upgrade.
func ACLCommands() []string {
	out := append([]string(nil), aclCommands...)
	sort.Strings(out)
	return out
}
