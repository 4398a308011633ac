// Package floor holds pairs of Redis operations that are not redsem's, for
// benchmarks to measure in the same run as redsem's uncontended
// Acquire+Release, so that their Redis cost compares.
package floor

import "github.com/gomodule/redigo/redis"

// Floor is a pair of operations that is not redsem's, measured in the same
// run as redsem's uncontended Acquire+Release so that their Redis cost
// compares (BenchmarkRedisTime, bench/instructions).
type Floor struct {
	Name string
	// Top lists the commands Pair sends: its Redis time is theirs (INFO
	// commandstats counts a script's inner commands apart, and they are in
	// the script's time already).
	Top []string
	// Pair runs one pair on conn, once Setup has run on it.
	Pair func(conn redis.Conn) error
}

// floorBase is the key prefix of the floors' keys: one hash tag, like a
// semaphore's.
const floorBase = "redsem:{floor}:"

// floorAcq stands for an acquisition id (as long as redsem's).
const floorAcq = "0123456789abcdef0123"

// Setup puts the four tokens the floors' pairs take on conn's Redis.
func Setup(conn redis.Conn) error {
	if _, err := conn.Do("DEL", floorBase+"tokens"); err != nil {
		return err
	}
	_, err := conn.Do("RPUSH", floorBase+"tokens", "1:1", "1:2", "1:3", "1:4")
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
// What redsem's pair costs above skeleton is its checks: no design of two
// scripts and 10 commands costs less than skeleton.
func All() []Floor {
	skeletonAcquire := redis.NewScript(6, `
local m = redis.call('HMGET', KEYS[1], 'size', 'epoch', 'fence', 'due', 'over', 'x:' .. ARGV[2], 'idle', 'exp')
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'fence', t[1] .. t[2])
local tok = redis.call('LPOP', KEYS[2])
redis.call('ZADD', KEYS[3], 'NX', t[1] * 1000 + ARGV[3], tok)
redis.call('HSET', KEYS[4], 't:' .. tok, ARGV[2] .. '|' .. t[1], 'a:' .. ARGV[2], tok)
return {1, tok, t[1], 1, t[2]}`)
	skeletonRelease := redis.NewScript(4, `
local h = redis.call('HMGET', KEYS[4], 't:' .. ARGV[1], 'slow', 'idle')
redis.call('HDEL', KEYS[4], 't:' .. ARGV[1], 'a:' .. ARGV[2])
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1`)
	emptyAcquire := redis.NewScript(6, `return {1, '1:1', '1', 1, '1'}`)
	emptyRelease := redis.NewScript(4, `return 1`)
	scripted := func(acquire, release *redis.Script) func(redis.Conn) error {
		return func(conn redis.Conn) error {
			b := floorBase
			r, err := redis.Values(acquire.Do(conn, b+"meta", b+"tokens", b+"leases", b+"holders", b+"waits",
				b+"pend:"+floorAcq, "4", floorAcq, "30000", "", "30000", "5000", "60000", "fresh"))
			if err != nil {
				return err
			}
			tok, err := redis.String(r[1], nil)
			if err != nil {
				return err
			}
			_, err = release.Do(conn, b+"meta", b+"tokens", b+"leases", b+"holders", tok, floorAcq)
			return err
		}
	}
	unlock := redis.NewScript(1, `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
	return []Floor{
		{"raw", []string{"blpop", "lpush"}, func(conn redis.Conn) error {
			tok, err := redis.Strings(conn.Do("BLPOP", floorBase+"tokens", 1))
			if err != nil {
				return err
			}
			_, err = conn.Do("LPUSH", floorBase+"tokens", tok[1])
			return err
		}},
		{"setnx", []string{"set", "evalsha"}, func(conn redis.Conn) error {
			if _, err := conn.Do("SET", floorBase+"lock", floorAcq, "NX", "PX", 30000); err != nil {
				return err
			}
			_, err := unlock.Do(conn, floorBase+"lock", floorAcq)
			return err
		}},
		{"empty", []string{"evalsha"}, scripted(emptyAcquire, emptyRelease)},
		{"skeleton", []string{"evalsha"}, scripted(skeletonAcquire, skeletonRelease)},
	}
}
