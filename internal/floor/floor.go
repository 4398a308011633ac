// Package floor holds pairs of Redis operations that are not redsem's, for
// benchmarks to measure in the same run as redsem's uncontended
// Acquire+Release, so that their Redis cost compares.
package floor

import "github.com/gomodule/redigo/redis"

// Floor is a pair of operations that is not redsem's, measured in the same
// run as redsem's uncontended Acquire+Release so that their Redis cost
// compares (BenchmarkSemaphore_Acquire_redisTime, bench/instructions).
type Floor struct {
	// Name is how a benchmark names it: raw, setnx, empty or skeleton.
	Name string
	// Top lists the commands Pair sends: its Redis time is theirs (INFO
	// commandstats counts a script's inner commands apart, and they are in
	// the script's time already).
	Top []string
	// Pair runs one pair on conn, once Setup has run on it.
	Pair func(conn redis.Conn) error
}

// base is the key prefix of the floors' keys: one hash tag, like a
// semaphore's, with a name of 26 bytes.
const base = "redsem:{floor-0123456789abcdef}:"

// acqID, epoch and label stand for an acquisition id, a semaphore's epoch
// and a lease's label, as long as redsem's (an id is 16 random bytes in
// hex, an epoch 6).
const (
	acqID = "0123456789abcdef0123456789abcdef"
	epoch = "edbc66154f0d"
	label = "vm:23828"
)

// Setup writes on conn's Redis what a semaphore of size 4 holds while
// nobody holds it: a meta hash with its six fields and four free tokens.
// The floors' pairs read and write those as redsem's pair does.
func Setup(conn redis.Conn) error {
	if _, err := conn.Do("DEL", base+"meta", base+"tokens", base+"leases", base+"holders"); err != nil {
		return err
	}
	if _, err := conn.Do("HSET", base+"meta", "size", 4, "gen", epoch, "fence", "1795811129821313",
		"due", "9000000000000000", "rejected", 0, "created", "1795811129786"); err != nil {
		return err
	}
	_, err := conn.Do("RPUSH", base+"tokens", epoch+":1", epoch+":2", epoch+":3", epoch+":4")
	return err
}

// All returns, cheapest first:
//   - raw: a BLPOP of a token and its LPUSH back, no script;
//   - setnx: a SET NX PX lock and a Lua release that checks its owner;
//   - empty: two scripts that return at once, called with an uncontended
//     pair's keys and arguments: what calling the two scripts costs;
//   - skeleton: two scripts that run an uncontended pair's 10 commands
//     (acquire: HMGET of meta's 8 fields, TIME, HSET of the fence, LPOP,
//     ZADD NX, HSET of the holder record; release: HMGET, HDEL, LPUSH,
//     ZREM) with its keys and arguments, checking nothing: what the
//     commands cost on top of that.
//
// What redsem's pair costs above skeleton is its checks: redsem's 10
// commands, on keys and arguments like its own, cost at least skeleton.
func All() []Floor {
	skeletonAcquire := redis.NewScript(6, `
local m = redis.call('HMGET', KEYS[1], 'size', 'gen', 'fence', 'due', 'over', 'x:' .. ARGV[2], 'idle', 'exp')
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'fence', t[1] .. t[2])
local tok = redis.call('LPOP', KEYS[2])
redis.call('ZADD', KEYS[3], 'NX', t[1] * 1000 + ARGV[3], tok)
redis.call('HSET', KEYS[4], 't:' .. tok, ARGV[2] .. '|' .. t[1] .. t[2] .. '|' .. t[1] .. '000|' .. ARGV[4], 'a:' .. ARGV[2], tok)
return {1, tok, t[1] .. t[2], t[1] * 1000 + ARGV[3], t[1] .. t[2]}`)
	skeletonRelease := redis.NewScript(4, `
local h = redis.call('HMGET', KEYS[4], 't:' .. ARGV[1], 'slow', 'idle')
redis.call('HDEL', KEYS[4], 't:' .. ARGV[1], 'a:' .. ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1`)
	emptyAcquire := redis.NewScript(6, `return {1, '`+epoch+`:1', '1795811129821313', 1795811159786, '1795811129821313'}`)
	emptyRelease := redis.NewScript(4, `return 1`)
	scripted := func(acquire, release *redis.Script) func(redis.Conn) error {
		return func(conn redis.Conn) error {
			b := base
			r, err := redis.Values(acquire.Do(conn, b+"meta", b+"tokens", b+"leases", b+"holders", b+"waits",
				b+"pend:"+acqID, "4", acqID, "30000", label, "30000", "5000", "37000", "fresh"))
			if err != nil {
				return err
			}
			tok, err := redis.String(r[1], nil)
			if err != nil {
				return err
			}
			_, err = release.Do(conn, b+"meta", b+"tokens", b+"leases", b+"holders", tok, acqID)
			return err
		}
	}
	unlock := redis.NewScript(1, `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	return []Floor{
		{"raw", []string{"blpop", "lpush"}, func(conn redis.Conn) error {
			tok, err := redis.Strings(conn.Do("BLPOP", base+"tokens", 1))
			if err != nil {
				return err
			}
			_, err = conn.Do("LPUSH", base+"tokens", tok[1])
			return err
		}},
		{"setnx", []string{"set", "evalsha"}, func(conn redis.Conn) error {
			if _, err := conn.Do("SET", base+"lock", acqID, "NX", "PX", 30000); err != nil {
				return err
			}
			_, err := unlock.Do(conn, base+"lock", acqID)
			return err
		}},
		{"empty", []string{"evalsha"}, scripted(emptyAcquire, emptyRelease)},
		{"skeleton", []string{"evalsha"}, scripted(skeletonAcquire, skeletonRelease)},
	}
}
