package redsem

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/internal/engine"
	_ "github.com/redsem/redsem/rate" // its scripts are declared too
)

// Every script Go declares lists its keys on a "-- KEYS:" header line, and
// Go passes exactly as many keys as that line names: a key added to a
// script or to its declaration without the other fails here, instead of
// shifting every argument by one at run time. Every file in lua/ is either
// an entry script or a helper that entry scripts run after, never both.
func TestScriptHeadersMatchDeclarations(t *testing.T) {
	decls := engine.Declarations()
	entries, helpers := map[string]bool{}, map[string]bool{}
	for _, d := range decls {
		entries[d.File] = true
		for _, h := range d.Helpers {
			helpers[h] = true
		}
	}
	for _, f := range []string{"acquire.lua", "release.lua", "refresh.lua", "abort.lua", "acquire_n.lua",
		"abort_n.lua", "resize.lua", "repair.lua", "check.lua", "status.lua", "rate_take.lua", "rate_abort.lua",
		"rate_set.lua", "rate_status.lua"} {
		assert.True(t, entries[f], "%s is not declared: is the registry still complete?", f)
	}
	assert.Empty(t, headerMismatches(decls))

	files, err := filepath.Glob("internal/engine/lua/*.lua")
	require.NoError(t, err)
	for _, f := range files {
		f = filepath.Base(f)
		assert.True(t, entries[f] != helpers[f], "%s: entry %v, helper %v: it must be exactly one", f, entries[f], helpers[f])
	}

	for _, d := range decls {
		assert.GreaterOrEqual(t, d.MinArgs, 0, "%s: its \"-- ARGV:\" header cannot be read", d.File)
	}

	// The check fails for a declaration that passes one key too few.
	wrong := append(decls, engine.Declaration{File: "acquire.lua", Keys: 5})
	assert.Len(t, headerMismatches(wrong), 1)
}

// headerMismatches lists the declarations whose key count differs from
// their script's header.
func headerMismatches(decls []engine.Declaration) []string {
	var out []string
	for _, d := range decls {
		names, err := engine.HeaderKeys(d.File)
		switch {
		case err != nil:
			out = append(out, err.Error())
		case len(names) != d.Keys:
			out = append(out, fmt.Sprintf("%s: Go passes %d keys, its header lists %d: %v", d.File, d.Keys, len(names), names))
		}
	}
	return out
}

// The reply codes codes.lua names are the ones Go names.
func TestReplyCodesMatch(t *testing.T) {
	want := map[string]int64{"WAITING": engine.CodeWaiting, "GRANTED": engine.CodeGranted,
		"SETTLED": engine.CodeSettled, "RELEASED": engine.CodeReleased}
	got := map[string]int64{}
	for _, line := range strings.Split(engine.MustRead("codes.lua"), "\n") {
		var name string
		var v int64
		if n, _ := fmt.Sscanf(line, "local %s = %d", &name, &v); n == 2 {
			got[name] = v
		}
	}
	assert.Equal(t, want, got)
}

// A call whose argument count differs from the script's "-- ARGV:" header
// is refused before anything is sent (engine.ErrArity); every call the
// suite makes passes through the same check, so a header and its call
// site cannot drift apart unnoticed.
func TestScriptCallsMatchArgvHeaders(t *testing.T) {
	ctx := context.Background()
	s, err := NewSemaphore(newPool(t, miniredisT(t).Addr()), "arity", 2)
	require.NoError(t, err)
	args := s.acquireArgs(newAcqID(), 0, "fresh") // the defaults left out: 6 keys, 8 arguments
	require.Len(t, args, 14)
	for _, bad := range [][]interface{}{args[:len(args)-1], append(args, "fixed", 0, "extra")} {
		_, err := runScript(ctx, nil, acquireScript, bad...) // a nil conn: nothing may be sent
		require.ErrorIs(t, err, engine.ErrArity)
	}
	lo, hi, err := engine.HeaderArgs("acquire.lua")
	require.NoError(t, err)
	assert.Equal(t, [2]int{8, 10}, [2]int{lo, hi}, "acquire.lua: 8 arguments, and optionally the size mode and the idle time")
	lo, hi, err = engine.HeaderArgs("resize.lua")
	require.NoError(t, err)
	assert.Equal(t, [2]int{2, 3}, [2]int{lo, hi}, "resize.lua: n, seed, and optionally idleMs")
	lo, hi, err = engine.HeaderArgs("release.lua")
	require.NoError(t, err)
	assert.Equal(t, [2]int{2, engine.Variadic}, [2]int{lo, hi}, "release.lua: token, acqID, then more tokens")
	lo, hi, err = engine.HeaderArgs("status.lua")
	require.NoError(t, err)
	assert.Equal(t, [2]int{0, 0}, [2]int{lo, hi})
	_, _, err = engine.HeaderArgs("base.lua")
	assert.Error(t, err, "a helper has no ARGV header")
}

// Every call names its arguments as the script's "-- ARGV:" header does
// (engine.Args): a call that names one differently, shifts one, leaves a
// required one out or adds one is refused before anything is sent, and the
// names the calls give are the header's.
func TestScriptCallsNameTheirArguments(t *testing.T) {
	ctx := context.Background()
	h, err := engine.HeaderArgNames("acquire_n.lua")
	require.NoError(t, err)
	assert.Equal(t, []string{"size", "acqID", "k", "ttlMs", "label", "blockMs", "graceMs", "tombMs", "pollMs",
		"phase", "sizeMode", "idleMs"}, h.Names)
	assert.Equal(t, 12, h.Required)
	h, err = engine.HeaderArgNames("refresh.lua")
	require.NoError(t, err)
	assert.Equal(t, engine.ArgHeader{Names: []string{"token", "acqID", "ttlMs"}, Required: 3, Rest: true}, h)
	h, err = engine.HeaderArgNames("acquire.lua")
	require.NoError(t, err)
	assert.Equal(t, 8, h.Required)
	assert.Equal(t, []string{"sizeMode", "idleMs"}, h.Names[8:])

	s, err := NewSemaphore(newPool(t, miniredisT(t).Addr()), "named", 2)
	require.NoError(t, err)
	keys := s.k.all(5)
	good := []engine.Arg{engine.A("limit", 10)}
	require.Equal(t, append(keys, 10), engine.Args(reclaimScript, keys, good...))
	for name, bad := range map[string][]engine.Arg{
		"renamed":  {engine.A("max", 10)},
		"extra":    {engine.A("limit", 10), engine.A("limit", 10)},
		"left out": {},
		"rest":     {engine.A("limit", 10), engine.Rest("x")},
	} {
		_, err := runScript(ctx, nil, reclaimScript, engine.Args(reclaimScript, keys, bad...)...) // a nil conn: nothing may be sent
		require.ErrorIs(t, err, engine.ErrArity, name)
	}
	// A list of values goes last.
	rel := []interface{}{s.k.meta, s.k.tokens, s.k.leases, s.k.holders}
	_, err = runScript(ctx, nil, releaseScript, engine.Args(releaseScript, rel,
		engine.A("token", "e:1"), engine.Rest("e:2"), engine.A("acqID", newAcqID()))...)
	require.ErrorIs(t, err, engine.ErrArity)
	assert.Len(t, engine.Args(releaseScript, rel, engine.A("token", "e:1"), engine.A("acqID", "a"), engine.Rest("e:2", "e:3")), 4+4)
	// Shifted: acqID and size swapped, the count right.
	acq := newAcqID()
	args := []engine.Arg{engine.A("acqID", acq), engine.A("size", 2), engine.A("ttlMs", 1000), engine.A("label", ""),
		engine.A("blockMs", 0), engine.A("graceMs", 100), engine.A("tombMs", 100), engine.A("phase", "fresh")}
	_, err = runScript(ctx, nil, acquireScript, engine.Args(acquireScript, append(keys, s.k.pend(acq)), args...)...)
	require.ErrorIs(t, err, engine.ErrArity)
	assert.ErrorContains(t, err, `argument 1 is "size", called as "acqID"`)
	// Optional ones: any first few, in order.
	args[0], args[1] = engine.A("size", 2), engine.A("acqID", acq)
	for _, tail := range [][]engine.Arg{nil, {engine.A("sizeMode", "fixed")}, {engine.A("sizeMode", "fixed"), engine.A("idleMs", 0)}} {
		all := engine.Args(acquireScript, append(keys, s.k.pend(acq)), append(args, tail...)...)
		assert.Len(t, all, 6+8+len(tail), "nothing appended to refuse the call")
	}
	_, err = runScript(ctx, nil, acquireScript, engine.Args(acquireScript, append(keys, s.k.pend(acq)), append(args, engine.A("idleMs", 0))...)...)
	require.ErrorIs(t, err, engine.ErrArity, "idleMs without sizeMode")
}
