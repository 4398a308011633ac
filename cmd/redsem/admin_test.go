//go:build unix

package main

import (
	"encoding/json"
	"testing"

	"github.com/gomodule/redigo/redis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
)

// resize, check and repair against a real server: resize --create creates,
// resize changes the size, check reports a sabotaged inventory with exit 65,
// and repair restores it.
func TestResizeCheckRepair(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(t, "resize", "--create", "adm", "3")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "created semaphore \"adm\" with 3 slot(s)\n", r.stdout)

	r = e.run(t, "check", "--json", "adm")
	require.Equal(t, 0, r.code, r.stderr)
	var inv struct {
		Size    int
		Free    []string
		Healthy bool `json:"healthy"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &inv), r.stdout)
	assert.Equal(t, 3, inv.Size)
	assert.Len(t, inv.Free, 3)
	assert.True(t, inv.Healthy)

	// Sabotage: a token taken away by hand, garbage pushed.
	c, err := redis.Dial("tcp", e.srv.Addr, redis.DialDatabase(2))
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Do("LPOP", "redsem:{adm}:tokens")
	require.NoError(t, err)
	_, err = c.Do("LPUSH", "redsem:{adm}:tokens", "garbage")
	require.NoError(t, err)

	r = e.run(t, "check", "adm")
	assert.Equal(t, 65, r.code, "an unhealthy inventory exits 65")
	assert.Contains(t, r.stdout, "strangers 1")
	assert.Empty(t, r.stderr)

	r = e.run(t, "repair", "adm")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "dropped 1, minted 1")
	r = e.run(t, "check", "adm")
	assert.Equal(t, 0, r.code, r.stdout)

	r = e.run(t, "resize", "adm", "5")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "status", "--json", "adm")
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	assert.Equal(t, 5, st.Size)
	assert.Equal(t, 5, st.Available)

	r = e.run(t, "resize", "adm", "zero")
	assert.Equal(t, 64, r.code)
	assert.Equal(t, "redsem: resize: N must be a whole number from 1 to 10000, not \"zero\"\n", r.stderr)
}

// After "redsem resize pool 1", run --size 3 fails with 65 as before, and
// run --size 3 --adopt-size follows the stored size: it runs, and its
// command sees REDSEM_SIZE=1.
func TestRunAdoptSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(t, "run", "--size", "3", "pool", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "resize", "pool", "1")
	require.Equal(t, 0, r.code, r.stderr)

	r = e.run(t, "run", "--size", "3", "pool", "--", "true")
	assert.Equal(t, exitData, r.code, "without --adopt-size a size mismatch stays an error")
	assert.Contains(t, r.stderr, "--adopt-size")

	r = e.run(t, "run", "--size", "3", "--adopt-size", "pool", "-c", `echo "size=$REDSEM_SIZE"`)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "size=1\n", r.stdout)

	// A name that does not exist yet is created with --size.
	r = e.run(t, "run", "--size", "3", "--adopt-size", "fresh", "-c", `echo "size=$REDSEM_SIZE"`)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "size=3\n", r.stdout)
}

// delete of a name that does not exist means one thing, with or without
// --force: exit 66 (no such name) and say so on stderr; a name that exists
// needs --force, and a second delete is then 66 again.
func TestDeleteMissing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, args := range [][]string{{"delete", "nope"}, {"delete", "--force", "nope"}} {
		r := e.run(t, args...)
		assert.Equal(t, exitNoName, r.code, "%v: %s", args, r.stderr)
		assert.Equal(t, "redsem: delete: no key of \"nope\" under prefix \"redsem:\"; nothing to delete\n", r.stderr, "%v", args)
		assert.Empty(t, r.stdout, "%v", args)
	}
	r := e.run(t, "resize", "--create", "there", "2")
	require.Equal(t, 0, r.code, r.stderr)
	r = e.run(t, "delete", "there")
	assert.Equal(t, exitUsage, r.code, "an existing one needs --force")
	assert.Equal(t, "redsem: delete: \"there\" is a semaphore of size 2 with 0 holder(s) and 0 waiter(s); add --force to delete its 2 keys\n", r.stderr)
	r = e.run(t, "delete", "--force", "there")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "deleted \"there\": semaphore (2 keys)\n", r.stdout)
	r = e.run(t, "delete", "--force", "there")
	assert.Equal(t, exitNoName, r.code, "twice: no such name")
}

// A key of the wrong type exits 65 with the reason on stderr and nothing on
// stdout that reads like a result: repair prints no report, and status does
// not call a lock whose key is of the wrong type "not existing" (run would
// fail on it with 65).
func TestWrongTypeExits65WithoutAReport(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := redis.Dial("tcp", e.srv.Addr, redis.DialDatabase(2))
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Do("SET", "redsem:{wt}:meta", "x")
	require.NoError(t, err)
	_, err = c.Do("SET", "redsem:{wtl}:rw:meta", "x")
	require.NoError(t, err)
	for _, args := range [][]string{{"repair", "wt"}, {"status", "wtl"}, {"run", "wtl", "--", "true"}, {"check", "wt"}, {"reclaim", "wt"}} {
		r := e.run(t, args...)
		assert.Equal(t, exitData, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "wrong type", "%v", args)
		assert.Empty(t, r.stdout, "%v", args)
	}
	// The admin commands say how to clear it; delete --force does, and says
	// which key of which type it removed.
	r := e.run(t, "repair", "wt")
	assert.Contains(t, r.stderr, "(redsem delete --force wt removes every key of the name)")
	r = e.run(t, "delete", "--force", "wt")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "deleted \"wt\": semaphore (1 key including redsem:{wt}:meta, a string)\n", r.stdout)
	r = e.run(t, "delete", "--force", "-v", "wtl")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "deleted \"wtl\": rwmutex (1 key including redsem:{wtl}:rw:meta, a string)\n  redsem:{wtl}:rw:meta (string)\n", r.stdout)
	n, err := redis.Int(c.Do("DBSIZE"))
	require.NoError(t, err)
	assert.Zero(t, n)
}

// check --server is admin.CheckServer: 0 on a server fit for redsem, 65
// naming an evicting maxmemory-policy, 69 with the permission to add for a
// user that may not send INFO.
func TestCheckServer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.run(t, "check", "--server")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "fit for redsem")

	e.srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	r = e.run(t, "check", "--server")
	assert.Equal(t, exitData, r.code, r.stderr)
	assert.Contains(t, r.stderr, "maxmemory-policy is allkeys-lru; use noeviction")

	args := []interface{}{"SETUSER", "no-info", "reset", "on", ">pw", "resetkeys", "~redsem:*", "resetchannels", "-@all", "+select"}
	for _, c := range admin.ACLCommands() {
		args = append(args, "+"+c)
	}
	e.srv.Do(t, "ACL", args...)
	e.url = "redis://no-info:pw@" + e.srv.Addr + "/2"
	r = e.run(t, "check", "--server")
	assert.Equal(t, exitUnavailable, r.code, r.stderr)
	assert.Contains(t, r.stderr, "allow +info to this user")

	r = e.run(t, "check", "--server", "name")
	assert.Equal(t, exitUsage, r.code, r.stderr)
}

// A name that clients of redsem before protocol v2 hold: the commands
// refuse it (exit 65) and say to stop those clients, never to delete the
// name, which would take their leases from under them.
func TestEarlierLayoutIsRefusedWithoutADeleteHint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := redis.Dial("tcp", e.srv.Addr, redis.DialDatabase(2))
	require.NoError(t, err)
	defer c.Close()
	now, err := redis.Int64s(c.Do("TIME"))
	require.NoError(t, err)
	deadline := now[0]*1000 + now[1]/1000 + 600000
	for _, cmd := range [][]interface{}{
		{"HSET", "redsem:{old}:meta", "size", 1, "epoch", "abcdefabcdef", "fence", now[0] * 1000000, "due", deadline},
		{"ZADD", "redsem:{old}:leases", deadline, "abcdefabcdef:1"},
		{"HSET", "redsem:{old}:holders", "t:abcdefabcdef:1", "0123456789abcdef0123456789abcdef|1|1|old", "a:0123456789abcdef0123456789abcdef", "abcdefabcdef:1"},
	} {
		_, err := c.Do(cmd[0].(string), cmd[1:]...)
		require.NoError(t, err)
	}
	for _, args := range [][]string{{"run", "--size", "1", "old", "--", "true"}, {"repair", "old"}, {"reclaim", "old"}} {
		r := e.run(t, args...)
		assert.Equal(t, exitData, r.code, "%v: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "before protocol v2", "%v", args)
		assert.NotContains(t, r.stderr, "delete", "%v", args)
	}
	epoch, err := redis.String(c.Do("HGET", "redsem:{old}:meta", "epoch"))
	require.NoError(t, err)
	assert.Equal(t, "abcdefabcdef", epoch, "a refused command moved the name")
}
