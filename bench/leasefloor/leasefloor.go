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
//
// The scripts are the files of lua/, each with its KEYS and ARGV named at
// the top. OneRecordFCall and Pipeline call functions instead (FCALL, Redis
// 7.0+) of libraries that LoadFunctions loads: OneRecord's own bodies, and
// lua/pipeline.lua, a candidate for protocol v2 that also sweeps what
// crashed holders and dead waiters left.
package leasefloor

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// lua returns the text of lua/<name>.lua.
func lua(name string) string {
	b, err := luaFiles.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// A call is one script of a floor: a script called by EVALSHA, or a
// function of a library that LoadFunctions loaded, called by FCALL.
type call struct {
	sc    *redis.Script // nil: FCALL fn
	fn    string
	nkeys int
}

// evalsha is the script made of files, joined in order.
func evalsha(nkeys int, files ...string) *call {
	var src []string
	for _, f := range files {
		src = append(src, lua(f))
	}
	return &call{sc: redis.NewScript(nkeys, strings.Join(src, "\n")), nkeys: nkeys}
}

func fcall(nkeys int, fn string) *call { return &call{fn: fn, nkeys: nkeys} }

// cmd is the call of c with keys and arguments, as a command to send.
func (c *call) cmd(keysAndArgs ...interface{}) []interface{} {
	if c.sc != nil {
		return append([]interface{}{"EVALSHA", c.sc.Hash(), c.nkeys}, keysAndArgs...)
	}
	return append([]interface{}{"FCALL", c.fn, c.nkeys}, keysAndArgs...)
}

// do calls c on conn (EVALSHA falls back to EVAL on NOSCRIPT).
func (c *call) do(ctx context.Context, conn redis.Conn, keysAndArgs ...interface{}) (interface{}, error) {
	if c.sc != nil {
		return c.sc.DoContext(ctx, conn, keysAndArgs...)
	}
	cmd := c.cmd(keysAndArgs...)
	return redis.DoContext(conn, ctx, cmd[0].(string), cmd[1:]...)
}

// A Floor is one way to record a lease.
type Floor struct {
	Name             string
	acquire, release *call
	holders          bool // the scripts take the holders hash as their last key
	// first, if set, runs before any wait (Register): it grants a free
	// token, or registers the waiter and the wait follows.
	first *call
	// queued: first only registers, written in one write with the wait.
	queued bool
	// register, if set (Pipeline), is first's registration alone, written
	// in one write with the wait by a Lock whose last acquisition waited.
	register *call
	// Functions: the floor calls functions that LoadFunctions loads.
	Functions bool
	// heldRelease: the wait moves the token onto held:<acq>, and the
	// release is NoScript's (release is nil).
	heldRelease bool
	// recordByAcq: the release also deletes the holder's record, a:<acq>
	// in the holders hash (Kept).
	recordByAcq bool
}

// ttlMs is every floor's lease time; floor:pipeline's waits block as long.
const ttlMs = 30000

// Lease records a lease the way redsem does: a leases zset member scored by
// its deadline and a holder record (owner|fence) in a hash, which the
// release reads (HGET) and deletes (HDEL).
var Lease = Floor{Name: "floor:lease", holders: true, acquire: evalsha(3, "lease_acquire"), release: evalsha(3, "lease_release")}

// Register is Lease with redsem's first round trip: a script that takes a
// free token and records its lease, or, with none free, registers the
// acquisition in a waits zset (scored by when it may be swept) and answers
// "wait"; the wait script takes the registration out as it records the
// lease. It measures what the registration costs, which buys redsem a
// waiter's pending list found and swept back if its script never runs, and
// a block that Redis chooses from the earliest lease deadline.
var Register = Floor{Name: "floor:register", holders: true, release: Lease.release,
	first: evalsha(4, "register_first"), acquire: evalsha(4, "register_wait")}

// Queued is Register with the registration written in the same write as
// the wait: a first script that registers and never grants, BLMOVE (which
// takes a free token at once) and the lease script. One round trip, free or
// not: what writing redsem's first script with its wait would save.
var Queued = Floor{Name: "floor:queued", holders: true, release: Lease.release, acquire: Register.acquire, queued: true,
	first: evalsha(4, "queued_first")}

// OneRecord keeps one record per lease: a leases member token|owner|fence,
// which the release's ZREM both checks and removes.
var OneRecord = Floor{Name: "floor:onerecord", acquire: evalsha(2, "onerecord_acquire"), release: evalsha(2, "onerecord_release")}

// Held is OneRecord's acquire with NoScript's release: the BLMOVE moves
// the token onto the holder's own list, where it stays, and the script
// behind it records the lease (a leases member, the acquisition, scored by
// its deadline); the release is two commands and no script, moving the
// token back only from the holder's list. It measures what a protocol
// whose release runs no script would cost (a shrink, a collector or an
// idle expiry would then be the acquirers' to settle).
var Held = Floor{Name: "floor:held", acquire: evalsha(2, "held_record"), heldRelease: true}

// Kept is Held with what redsem promises on a grant, kept so that a
// release of commands alone stays safe (lua/kept_grant.lua): the FM-22
// guard (a popped token that is not one of the size's, or a copy of a
// token its holder still has, is dropped and the acquisition goes on; the
// copy is found through t:<token>, which names the last holder and which a
// release cannot delete, since it cannot check whose it is), the fence above the
// last one, the record a:<acq>, meta's fields read once, the first write
// one that Redis refuses at maxmemory, and the registration in the same
// write as the wait, swept back if the script behind the BLMOVE never ran
// (the holder's list and the lease are one zset member, acq, whose score the
// grant moves from the sweep's time to the deadline). A free token is taken
// by one script; the release is LMOVE held:<acq>, ZREM and HDEL in one
// transaction (heldRelease). It measures what redsem's promises cost a
// protocol whose release runs no script: the cheapest that floor:held
// leaves out. Two promises it cannot keep that way: at maxmemory the
// release is refused (its token comes back at the lease's deadline), and
// so is the record behind a BLMOVE that moved a token (it comes back when
// the registration is swept), where redsem's scripts free memory first.
var Kept = Floor{Name: "floor:kept", heldRelease: true, recordByAcq: true,
	first:    evalsha(2, "kept_grant", "kept_acquire"),
	register: evalsha(2, "kept_grant", "kept_register"),
	acquire:  evalsha(2, "kept_grant", "kept_record")}

// OneRecordFCall is OneRecord with its two scripts, the same Lua bodies,
// loaded as a Function library and called by FCALL instead of EVALSHA.
var OneRecordFCall = Floor{Name: "floor:onerecord-fcall", Functions: true,
	acquire: fcall(2, "onerecord_acquire"), release: fcall(2, "onerecord_release")}

// Pipeline is a candidate for protocol v2 (lua/pipeline.lua): OneRecord's
// record, an acquire of one FCALL when a token is free, and one write
// (register, BLMOVE, record) when the client expects to wait.
var Pipeline = Floor{Name: "floor:pipeline", Functions: true, first: fcall(2, "pipeline_acquire"),
	register: fcall(2, "pipeline_register"), acquire: fcall(2, "pipeline_record"), release: fcall(2, "pipeline_release")}

// libraries are the Function libraries of the floors: OneRecordFCall's is
// made of OneRecord's script files, each body the function's, so that the
// two differ only in how they are called.
func libraries() []string {
	var b strings.Builder
	b.WriteString("#!lua name=floor_onerecord\n")
	for _, fn := range []string{"onerecord_acquire", "onerecord_release"} {
		fmt.Fprintf(&b, "redis.register_function('%s', function(KEYS, ARGV)\n%s\nend)\n", fn, lua(fn))
	}
	return []string{b.String(), lua("pipeline")}
}

// LoadFunctions loads the floors' Function libraries on conn (FUNCTION LOAD
// REPLACE, Redis 7.0+), once before any floor with Functions runs. It
// returns how many it loaded.
func LoadFunctions(conn redis.Conn) (int, error) {
	libs := libraries()
	for _, lib := range libs {
		if _, err := conn.Do("FUNCTION", "LOAD", "REPLACE", lib); err != nil {
			return 0, err
		}
	}
	return len(libs), nil
}

// Prepare loads f's scripts (not its functions: LoadFunctions) and makes
// key a lock of size tokens.
func (f Floor) Prepare(conn redis.Conn, key string, size int) error {
	for _, c := range []*call{f.first, f.register, f.acquire, f.release} {
		if c == nil || c.sc == nil {
			continue
		}
		if err := c.sc.Load(conn); err != nil {
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
	if f.recordByAcq { // Kept's meta fields: its grant checks tokens against the size
		if _, err := conn.Do("HSET", key+":holders", "size", size, "gen", 1); err != nil {
			return err
		}
	}
	_, err := conn.Do("RPUSH", args...)
	return err
}

// keys returns the scripts' keys: first (pend or tokens), then the rest.
func (f Floor) keys(key, first string) []interface{} {
	switch {
	case f.register != nil, !f.holders:
		return []interface{}{first, key + ":leases"}
	case f.first != nil:
		return []interface{}{first, key + ":leases", key + ":holders", key + ":waits"}
	}
	return []interface{}{first, key + ":leases", key + ":holders"}
}

// A Lock is one client's handle on the lock key of floor f. Only
// floor:pipeline keeps anything in it: whether its last acquisition waited,
// which chooses its next acquire.
type Lock struct {
	f      Floor
	key    string
	waited atomic.Bool
}

// Lock returns a handle on the lock key.
func (f Floor) Lock(key string) *Lock { return &Lock{f: f, key: key} }

// Acquire is f.Lock(key).Acquire(ctx, conn).
func (f Floor) Acquire(ctx context.Context, conn redis.Conn, key string) (func(context.Context, redis.Conn) error, error) {
	return f.Lock(key).Acquire(ctx, conn)
}

// Acquire waits on conn until it holds a token, or ctx ends (which leaves
// conn unusable). It returns the lease's release.
func (l *Lock) Acquire(ctx context.Context, conn redis.Conn) (func(context.Context, redis.Conn) error, error) {
	f, key := l.f, l.key
	acq := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	if f.acquire == nil {
		return noScriptAcquire(ctx, conn, key, acq)
	}
	pend := key + ":pend:" + acq
	if f.heldRelease {
		pend = key + ":held:" + acq
	}
	release := func(tok, fence string) func(context.Context, redis.Conn) error {
		if f.heldRelease {
			return heldRelease(key, acq, f.recordByAcq)
		}
		keys := []interface{}{key, key + ":leases"}
		args := append(keys, tok+"|"+acq+"|"+fence, tok)
		if f.holders {
			args = append(keys, key+":holders", tok, acq)
		}
		return func(ctx context.Context, conn redis.Conn) error {
			ok, err := redis.Int(f.release.do(ctx, conn, args...))
			if err == nil && ok != 1 {
				err = errors.New(key + ": released a lease it did not hold")
			}
			return err
		}
	}
	// with is the call of c with its keys (first: tokens or pend).
	with := func(c *call, first string) []interface{} {
		return c.cmd(append(f.keys(key, first), acq, ttlMs)...)
	}
	wait := []interface{}{"BLMOVE", key, pend, "LEFT", "RIGHT", 0}
	if f.register != nil {
		wait[len(wait)-1] = ttlMs / 1000
	}
	if f.first != nil && !f.queued && !l.waited.Load() {
		v, err := f.first.do(ctx, conn, append(f.keys(key, key), acq, ttlMs)...)
		if err != nil {
			return nil, err
		}
		if g, err := redis.Strings(v, nil); err == nil {
			return release(g[0], g[1]), nil
		}
		// Registered: the wait follows. floor:pipeline's next acquisition
		// writes its registration with the wait.
		l.waited.Store(f.register != nil)
		rs, err := pipeline(ctx, conn, [][]interface{}{wait, with(f.acquire, pend)})
		if err != nil {
			return nil, err
		}
		if v, err := redis.Strings(rs[1], nil); err == nil {
			return release(v[0], v[1]), nil
		} else if f.register == nil {
			return nil, err
		}
		// floor:pipeline's wait timed out: register again, below.
	}
	for {
		cmds := [][]interface{}{wait, with(f.acquire, pend)}
		switch {
		case f.register != nil:
			cmds = append([][]interface{}{with(f.register, key)}, cmds...)
		case f.queued:
			cmds = append([][]interface{}{with(f.first, key)}, cmds...)
		}
		rs, err := pipeline(ctx, conn, cmds)
		if err != nil {
			return nil, err
		}
		v, err := redis.Strings(rs[len(rs)-1], nil)
		if err != nil && f.register != nil && rs[len(rs)-1] == int64(0) {
			continue // floor:pipeline's wait timed out
		} else if err != nil {
			return nil, err
		}
		if f.register != nil {
			// It waited if Redis's clock moved more than 20 µs from the
			// registration to the record, which run back to back when the
			// BLMOVE between them does not block.
			reg, _ := strconv.ParseInt(string(rs[0].([]byte)), 10, 64)
			fence, _ := strconv.ParseInt(v[1], 10, 64)
			l.waited.Store(fence-reg > 20)
		}
		return release(v[0], v[1]), nil
	}
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
	return heldRelease(key, acq, false), nil
}

// heldRelease is the release of NoScript, Held and Kept: the token moves
// back only from the holder's list (the owner check), with a ZREM of the
// lease in the same write. With record (Kept) it also deletes the holder's
// record, and the three run as one transaction (MULTI/EXEC): at maxmemory
// Redis refuses the LMOVE, and a release that went on without it would
// leave the token on the holder's list with no lease for a sweep to find;
// refused whole, the lease stays and its token comes back at its deadline.
func heldRelease(key, acq string, record bool) func(context.Context, redis.Conn) error {
	held, leases := key+":held:"+acq, key+":leases"
	cmds := [][]interface{}{{"LMOVE", held, key, "LEFT", "LEFT"}, {"ZREM", leases, acq}}
	if record {
		cmds = append([][]interface{}{{"MULTI"}}, append(cmds, []interface{}{"HDEL", key + ":holders", "a:" + acq}, []interface{}{"EXEC"})...)
	}
	return func(ctx context.Context, conn redis.Conn) error {
		rs, err := pipeline(ctx, conn, cmds)
		moved := func() bool { return rs[0] != nil }
		if err == nil && record {
			ex, xerr := redis.Values(rs[len(rs)-1], nil)
			if xerr != nil || len(ex) == 0 {
				return fmt.Errorf("%s: the release's transaction: %v", key, xerr)
			}
			moved = func() bool { return ex[0] != nil }
		}
		if err == nil && !moved() {
			err = errors.New(key + ": released a lease it did not hold")
		}
		return err
	}
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
