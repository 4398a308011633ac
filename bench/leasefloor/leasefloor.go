// Package leasefloor holds locks that are not redsem's, for the bench to
// measure beside it: a raw BLPOP pass (a list of tokens, taken by a
// blocking pop, given back by LPUSH) plus one of redsem's promises, that
// Redis records the holder before the holder learns that it holds, and that
// only the holder can give the token back.
//
// Lease and OneRecord keep it with scripts: a waiter's BLMOVE moves a token
// onto a list of its acquisition's own, and a script written behind it in
// the same write pops it from there and records the lease (its deadline
// from Redis's TIME, a fence that is TIME's µs) before the reply is read;
// the release script gives the token back only if the record is the
// releaser's. NoScript keeps it with commands alone. Each takes one round
// trip to acquire, free or not, and one to release. Nothing else of
// redsem's: a crashed holder's token is never reclaimed, a blocked waiter
// never wakes to sweep, no argument, type or memory checks.
package leasefloor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/gomodule/redigo/redis"
)

// A Floor is one way to record a lease.
type Floor struct {
	Name             string
	acquire, release *redis.Script
	holders          bool // the scripts take the holders hash as their last key
	// first, if set, runs before any wait (Register): it grants a free
	// token, or registers the waiter and the wait follows.
	first *redis.Script
	// queued: first only registers, written in one write with the wait.
	queued bool
}

// Lease records a lease the way redsem does: a leases zset member scored by
// its deadline and a holder record (owner|fence) in a hash, which the
// release reads (HGET) and deletes (HDEL).
var Lease = Floor{Name: "floor:lease", holders: true, acquire: redis.NewScript(3, `
-- KEYS: pend, leases, holders; ARGV: acqID, ttlMs. Returns {token, fence}.
local pend, leases, holders = KEYS[1], KEYS[2], KEYS[3]
local acq, ttl = ARGV[1], ARGV[2]
local tok = redis.call('LPOP', pend)
local t = redis.call('TIME')
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, tok)
redis.call('HSET', holders, tok, acq .. '|' .. fence)
return {tok, fence}`), release: redis.NewScript(3, `
-- KEYS: tokens, leases, holders; ARGV: token, acqID. Returns 1 if acqID
-- held the token (it went back), else 0.
local tokens, leases, holders = KEYS[1], KEYS[2], KEYS[3]
local tok, acq = ARGV[1], ARGV[2]
local rec = redis.call('HGET', holders, tok)
if not rec or string.sub(rec, 1, #acq + 1) ~= acq .. '|' then return 0 end
redis.call('HDEL', holders, tok)
redis.call('LPUSH', tokens, tok)
redis.call('ZREM', leases, tok)
return 1`)}

// Register is Lease with redsem's first round trip: a script that takes a
// free token and records its lease, or, with none free, registers the
// acquisition in a waits zset (scored by when it may be swept) and answers
// "wait"; the wait script takes the registration out as it records the
// lease. It measures what the registration costs, which buys redsem a
// waiter's pending list found and swept back if its script never runs, and
// a block that Redis chooses from the earliest lease deadline.
var Register = Floor{Name: "floor:register", holders: true, release: Lease.release, first: redis.NewScript(4, `
-- KEYS: tokens, leases, holders, waits; ARGV: acqID, ttlMs. Returns
-- {token, fence}, or 0 (registered: wait).
local tokens, leases, holders, waits = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local acq, ttl = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local tok = redis.call('LPOP', tokens)
if not tok then
  redis.call('ZADD', waits, t[1] * 1000 + 35000, 'w:' .. acq)
  return 0
end
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, tok)
redis.call('HSET', holders, tok, acq .. '|' .. fence)
return {tok, fence}`), acquire: redis.NewScript(4, `
-- KEYS: pend, leases, holders, waits; ARGV: acqID, ttlMs. Returns {token, fence}.
local pend, leases, holders, waits = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local acq, ttl = ARGV[1], ARGV[2]
local tok = redis.call('LPOP', pend)
local t = redis.call('TIME')
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, tok)
redis.call('HSET', holders, tok, acq .. '|' .. fence)
redis.call('ZREM', waits, 'w:' .. acq)
return {tok, fence}`)}

// Queued is Register with the registration written in the same write as
// the wait: a first script that registers and never grants, BLMOVE (which
// takes a free token at once) and the lease script. One round trip, free or
// not: what writing redsem's first script with its wait would save.
var Queued = Floor{Name: "floor:queued", holders: true, release: Lease.release, acquire: Register.acquire, queued: true,
	first: redis.NewScript(4, `
-- KEYS: tokens, leases, holders, waits; ARGV: acqID, ttlMs. Returns 0.
local waits, acq = KEYS[4], ARGV[1]
local t = redis.call('TIME')
redis.call('ZADD', waits, t[1] * 1000 + 35000, 'w:' .. acq)
return 0`)}

// OneRecord keeps one record per lease: a leases member token|owner|fence,
// which the release's ZREM both checks and removes.
var OneRecord = Floor{Name: "floor:onerecord", acquire: redis.NewScript(2, `
-- KEYS: pend, leases; ARGV: acqID, ttlMs. Returns {token, fence}.
local pend, leases = KEYS[1], KEYS[2]
local acq, ttl = ARGV[1], ARGV[2]
local tok = redis.call('LPOP', pend)
local t = redis.call('TIME')
local fence = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
redis.call('ZADD', leases, t[1] * 1000 + math.floor(t[2] / 1000) + ttl, tok .. '|' .. acq .. '|' .. fence)
return {tok, fence}`), release: redis.NewScript(2, `
-- KEYS: tokens, leases; ARGV: the lease's member, its token. Returns 1 if
-- the lease was there (the token went back), else 0.
local tokens, leases = KEYS[1], KEYS[2]
local lease, tok = ARGV[1], ARGV[2]
if redis.call('ZREM', leases, lease) == 0 then return 0 end
redis.call('LPUSH', tokens, tok)
return 1`)}

// Prepare loads f's scripts and makes key a lock of size tokens.
func (f Floor) Prepare(conn redis.Conn, key string, size int) error {
	for _, sc := range []*redis.Script{f.first, f.acquire, f.release} {
		if sc == nil {
			continue
		}
		if err := sc.Load(conn); err != nil {
			return err
		}
	}
	args := []interface{}{key}
	for i := 1; i <= size; i++ {
		args = append(args, strconv.Itoa(i))
	}
	if _, err := conn.Do("DEL", key, key+":leases", key+":holders", key+":fence", key+":waits"); err != nil {
		return err
	}
	_, err := conn.Do("RPUSH", args...)
	return err
}

// keys returns the scripts' keys: first (pend or tokens), then the rest.
func (f Floor) keys(key, first string) []interface{} {
	if f.first != nil {
		return []interface{}{first, key + ":leases", key + ":holders", key + ":waits"}
	}
	if f.holders {
		return []interface{}{first, key + ":leases", key + ":holders"}
	}
	return []interface{}{first, key + ":leases"}
}

// Acquire waits on conn until it holds a token of key, or ctx ends (which
// leaves conn unusable). It returns the lease's release.
func (f Floor) Acquire(ctx context.Context, conn redis.Conn, key string) (func(context.Context, redis.Conn) error, error) {
	acq := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	if f.acquire == nil {
		return noScriptAcquire(ctx, conn, key, acq)
	}
	pend := key + ":pend:" + acq
	release := func(tok, fence string) func(context.Context, redis.Conn) error {
		keys := []interface{}{key, key + ":leases"}
		args := append(keys, tok+"|"+acq+"|"+fence, tok)
		if f.holders {
			args = append(keys, key+":holders", tok, acq)
		}
		return func(ctx context.Context, conn redis.Conn) error {
			ok, err := redis.Int(f.release.DoContext(ctx, conn, args...))
			if err == nil && ok != 1 {
				err = errors.New(key + ": released a lease it did not hold")
			}
			return err
		}
	}
	// evalsha is the call of sc with its keys (first: tokens or pend).
	evalsha := func(sc *redis.Script, first string) []interface{} {
		ks := f.keys(key, first)
		return append([]interface{}{"EVALSHA", sc.Hash(), len(ks)}, append(ks, acq, 30000)...)
	}
	if f.first != nil && !f.queued {
		v, err := f.first.DoContext(ctx, conn, append(f.keys(key, key), acq, 30000)...)
		if err != nil {
			return nil, err
		}
		if g, err := redis.Strings(v, nil); err == nil {
			return release(g[0], g[1]), nil
		}
	}
	cmds := [][]interface{}{{"BLMOVE", key, pend, "LEFT", "RIGHT", 0}, evalsha(f.acquire, pend)}
	if f.queued {
		cmds = append([][]interface{}{evalsha(f.first, key)}, cmds...)
	}
	rs, err := pipeline(ctx, conn, cmds)
	if err != nil {
		return nil, err
	}
	v, err := redis.Strings(rs[len(rs)-1], nil)
	if err != nil {
		return nil, err
	}
	return release(v[0], v[1]), nil
}

// NoScript keeps Lease's promise with commands alone: the token moves onto
// a list named for its holder (the record), and a ZADD of the lease's
// deadline (by the client's clock) and an INCR of the fence ride in the
// same write, so that Redis runs them before it writes the reply (though
// not atomically with the move: another client may run a command in
// between). The release moves the token back only from the holder's list
// (the owner check), with a ZREM of the lease in the same write.
var NoScript = Floor{Name: "floor:noscript"}

func noScriptAcquire(ctx context.Context, conn redis.Conn, key, acq string) (func(context.Context, redis.Conn) error, error) {
	held, leases := key+":held:"+acq, key+":leases"
	rs, err := pipeline(ctx, conn, [][]interface{}{
		{"BLMOVE", key, held, "LEFT", "RIGHT", 0},
		{"ZADD", leases, time.Now().Add(30 * time.Second).UnixMilli(), acq},
		{"INCR", key + ":fence"},
	})
	if err != nil {
		return nil, err
	}
	if _, err := redis.Int64(rs[2], nil); err != nil { // the fence
		return nil, err
	}
	return func(ctx context.Context, conn redis.Conn) error {
		rs, err := pipeline(ctx, conn, [][]interface{}{{"LMOVE", held, key, "LEFT", "LEFT"}, {"ZREM", leases, acq}})
		if err == nil && rs[0] == nil {
			err = errors.New(key + ": released a lease it did not hold")
		}
		return err
	}, nil
}

// pipeline writes cmds on conn at once and returns their replies, or the
// first error among them.
func pipeline(ctx context.Context, conn redis.Conn, cmds [][]interface{}) ([]interface{}, error) {
	for _, c := range cmds {
		if err := conn.Send(c[0].(string), c[1:]...); err != nil {
			return nil, err
		}
	}
	rs, err := redis.Values(redis.DoContext(conn, ctx, ""))
	if err != nil {
		return nil, err
	}
	for _, r := range rs {
		if e, ok := r.(redis.Error); ok {
			return nil, e
		}
	}
	return rs, nil
}
