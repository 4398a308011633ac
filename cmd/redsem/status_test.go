//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
)

func TestStatusJSONAndTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, helperEnvFor(), append([]string{"run", "--size", "3", "--label", "nightly job", "st"}, helperArgs()...)...)
	waitHelper(t, e.dir, "child")
	info := helperInfo(e.dir, "child") // mode pid fence slot token
	require.Len(t, info, 5)
	fence, err := strconv.ParseInt(info[2], 10, 64)
	require.NoError(t, err)

	r := e.run(t, "status", "--json", "st")
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	assert.True(t, st.Exists)
	assert.Equal(t, "st", st.Name)
	assert.Equal(t, 3, st.Size)
	assert.Equal(t, 2, st.Available)
	assert.Equal(t, 1, st.Held)
	require.Len(t, st.Holders, 1)
	h := st.Holders[0]
	assert.Equal(t, fence, h.Fence, "status shows the fence the command saw in REDSEM_FENCE")
	assert.Equal(t, info[3], strconv.Itoa(h.Slot), "slot is a number")
	assert.Equal(t, info[4], h.Token)
	assert.Equal(t, "nightly job", h.Label)
	assert.False(t, h.Expired)
	assert.Greater(t, h.TTLLeftMs, int64(0))

	r = e.run(t, "status", "st")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "available  2")
	assert.Contains(t, r.stdout, "SLOT")
	assert.Contains(t, r.stdout, info[2])

	r = e.run(t, "status", "--json", "nobody")
	require.Equal(t, 0, r.code, r.stderr)
	var none statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &none))
	assert.False(t, none.Exists)
	assert.Equal(t, "none", none.Kind)
	assert.Empty(t, none.Holders)

	r = e.run(t, "reclaim", "st")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "reclaimed 0")

	r = e.run(t, "delete", "st")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, "--force")
	assert.Contains(t, r.stderr, "1 holder(s)")
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"))
}

// status --json and check --json share one style: snake_case keys, no null
// anywhere (lists are arrays), slots as numbers.
func TestJSONStyle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, helperEnvFor(), append([]string{"run", "--size", "2", "js"}, helperArgs()...)...)
	waitHelper(t, e.dir, "child")
	for _, args := range [][]string{
		{"status", "--json", "js"}, {"check", "--json", "js"}, {"status", "--json", "none"},
	} {
		r := e.run(t, args...)
		require.Equal(t, 0, r.code, "%v: %s", args, r.stderr)
		var doc map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc), r.stdout)
		checkJSONStyle(t, strings.Join(args, " "), doc)
		assert.Contains(t, doc, "kind")
		assert.Contains(t, doc, "name")
		assert.Contains(t, doc, "exists")
	}
	r := e.run(t, "status", "--json", "js")
	var doc struct {
		Holders []map[string]any `json:"holders"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &doc))
	require.Len(t, doc.Holders, 1)
	assert.IsType(t, float64(0), doc.Holders[0]["slot"], "slot is a number")
	r = e.run(t, "check", "--json", "js")
	var inv map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &inv))
	assert.Len(t, inv["leased"], 1)
	assert.Len(t, inv["free"], 1)
	assert.Equal(t, true, inv["healthy"])
}

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

func checkJSONStyle(t *testing.T, where string, v any) {
	t.Helper()
	switch v := v.(type) {
	case nil:
		assert.Fail(t, "null in JSON", where)
	case map[string]any:
		for k, x := range v {
			assert.Regexp(t, snakeCase, k, where)
			checkJSONStyle(t, where+"."+k, x)
		}
	case []any:
		for i, x := range v {
			checkJSONStyle(t, fmt.Sprintf("%s[%d]", where, i), x)
		}
	}
}

// Every field of admin.Inventory has its snake_case key in check --json.
func TestCheckJSONCoversInventory(t *testing.T) {
	keys := map[string]bool{}
	ct := reflect.TypeOf(checkJSON{})
	for i := 0; i < ct.NumField(); i++ {
		keys[ct.Field(i).Tag.Get("json")] = true
	}
	it := reflect.TypeOf(admin.Inventory{})
	for i := 0; i < it.NumField(); i++ {
		name := it.Field(i).Name
		snake := strings.ToLower(regexp.MustCompile(`([a-z])([A-Z])`).ReplaceAllString(name, "${1}_${2}"))
		assert.True(t, keys[snake], "Inventory.%s has no %q in check --json", name, snake)
	}
}

// A corrupt semaphore is corrupt in every view: status and repair fail as
// run does and point at delete --force, top lists it as unreadable, and a
// name whose only keys an acquisition would refuse is no "does not exist".
// Stray tokens, which check calls unhealthy, are named with what drops them.
func TestStatusNamesCorruption(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := fleetPool(t, e).Get()
	defer c.Close()
	do := func(args ...any) {
		t.Helper()
		_, err := c.Do(args[0].(string), args[1:]...)
		require.NoError(t, err)
	}
	for _, name := range []string{"shape", "foreign"} {
		r := e.run(t, "resize", "--create", name, "3")
		require.Equal(t, 0, r.code, r.stderr)
	}
	do("HSET", "redsem:{shape}:meta", "size", "abc")
	do("SET", "redsem:{typed}:tokens", "a stranger's")
	do("RPUSH", "redsem:{residue}:tokens", "3f2a9c0d41be:1")
	do("HSET", "redsem:{tomb}:holders", "x:0123456789abcdef", "1")
	do("LPUSH", "redsem:{foreign}:tokens", "not-a-token")

	for _, tc := range []struct{ name, msg string }{
		{"shape", `redsem: semaphore state is corrupt: redsem:{shape}:meta is not a redsem meta record (redsem delete --force shape removes every key of the name)`},
		{"typed", `redsem: key holds the wrong type: redsem:{typed}:tokens holds a string, want a list (redsem delete --force typed removes every key of the name)`},
		{"residue", `redsem: semaphore state is corrupt: redsem:{residue}:meta is missing but tokens or leases exist (redsem delete --force residue removes every key of the name)`},
	} {
		for _, args := range [][]string{{"status", tc.name}, {"status", "--json", tc.name}, {"check", tc.name},
			{"repair", tc.name}, {"run", "--size", "3", tc.name, "--", "true"}} {
			r := e.run(t, args...)
			assert.Equal(t, exitData, r.code, "%v: %s", args, r.stderr)
			assert.Empty(t, r.stdout, "%v", args)
			if args[0] != "run" {
				assert.Equal(t, tc.msg+"\n", r.stderr, "%v", args)
			}
		}
	}
	r := e.run(t, "top", "-n", "1", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var fl fleetJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &fl), r.stdout)
	require.Len(t, fl.Failed, 1, r.stdout)
	assert.Equal(t, failedJSON{Kind: "semaphore", Name: "shape", Error: "redsem: semaphore state is corrupt: redsem:{shape}:meta is not a redsem meta record"}, fl.Failed[0])

	r = e.run(t, "status", "tomb")
	assert.Equal(t, 0, r.code, "a tombstone alone is no semaphore yet: %s", r.stderr)
	assert.Contains(t, r.stdout, `"tomb" does not exist`)
	r = e.run(t, "status", "foreign")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "stray      1 (rejected so far: 0): unhealthy, redsem repair foreign drops them\n")
}
