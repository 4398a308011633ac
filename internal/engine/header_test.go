package engine

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every script Go declares lists its keys on a "-- KEYS:" header line, and
// Go passes exactly as many keys as that line names: a key added to a
// script or to its declaration without the other fails here, instead of
// shifting every argument by one at run time. Every file in lua/ is either
// an entry script or a helper that entry scripts run after, never both.
func TestScriptHeadersMatchDeclarations(t *testing.T) {
	decls := declarations()
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

	files, err := filepath.Glob("lua/*.lua")
	require.NoError(t, err)
	for _, f := range files {
		f = filepath.Base(f)
		assert.True(t, entries[f] != helpers[f], "%s: entry %v, helper %v: it must be exactly one", f, entries[f], helpers[f])
	}

	// The check fails for a declaration that passes one key too few.
	wrong := append(decls, Declaration{File: "acquire.lua", Keys: 5})
	assert.Len(t, headerMismatches(wrong), 1)
}

// headerMismatches lists the declarations whose key count differs from
// their script's header.
func headerMismatches(decls []Declaration) []string {
	var out []string
	for _, d := range decls {
		names, err := headerKeys(d.File)
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
	want := map[string]int64{"WAITING": CodeWaiting, "GRANTED": CodeGranted,
		"SETTLED": CodeSettled, "RELEASED": CodeReleased}
	got := map[string]int64{}
	for _, line := range strings.Split(part("codes.lua"), "\n") {
		var name string
		var v int64
		if n, _ := fmt.Sscanf(line, "local %s = %d", &name, &v); n == 2 {
			got[name] = v
		}
	}
	assert.Equal(t, want, got)
}

// Every script's argument type is its "-- ARGV:" header: one field per
// name, in order and named alike (case aside), then a slice if and only if
// the header ends in a "then" item; no header has optional names and a
// "then" item both (With could not tell where the list starts). The check
// fails for a script declared with another script's type.
func TestArgTypesMatchHeaders(t *testing.T) {
	decls := declarations()
	assert.Empty(t, argTypeMismatches(decls))
	wrong := Declaration{File: "acquire.lua", Keys: 6, Args: reflect.TypeFor[AcquireNArgs]()}
	assert.Len(t, argTypeMismatches([]Declaration{wrong}), 1)
	wrong = Declaration{File: "release.lua", Keys: 4, Args: reflect.TypeFor[AbortArgs]()}
	assert.Len(t, argTypeMismatches([]Declaration{wrong}), 1)

	h, err := argHeader("acquire.lua", part("acquire.lua"))
	require.NoError(t, err)
	assert.Equal(t, 8, h.Required)
	assert.Equal(t, []string{"sizeMode", "idleMs"}, h.Names[8:])
	h, err = argHeader("refresh.lua", part("refresh.lua"))
	require.NoError(t, err)
	assert.Equal(t, ArgHeader{Names: []string{"token", "acqID", "ttlMs"}, Required: 3, Rest: true}, h)
	_, err = argHeader("base.lua", part("base.lua"))
	assert.Error(t, err, "a helper has no ARGV header")
}

// argTypeMismatches lists the declarations whose argument type differs
// from their script's "-- ARGV:" header.
func argTypeMismatches(decls []Declaration) []string {
	var out []string
	for _, d := range decls {
		h, err := argHeader(d.File, part(d.File))
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		var names []string
		slice := false
		for i := 0; i < d.Args.NumField(); i++ {
			f := d.Args.Field(i)
			if f.Type.Kind() == reflect.Slice {
				slice = i == d.Args.NumField()-1
				if !slice {
					out = append(out, fmt.Sprintf("%s: %s %s: a list before the last field", d.File, d.Args, f.Name))
				}
				continue
			}
			names = append(names, strings.ToLower(f.Name))
		}
		want := []string{}
		for _, n := range h.Names {
			want = append(want, strings.ToLower(n))
		}
		switch {
		case fmt.Sprint(names) != fmt.Sprint(want):
			out = append(out, fmt.Sprintf("%s: %s has fields %v, its header names %v", d.File, d.Args, names, h.Names))
		case slice != h.Rest:
			out = append(out, fmt.Sprintf("%s: %s ends in a list: %v, its header: %v", d.File, d.Args, slice, h.Rest))
		case h.Rest && h.Required != len(h.Names):
			out = append(out, fmt.Sprintf("%s: optional arguments before a list", d.File))
		case d.required != h.Required:
			out = append(out, fmt.Sprintf("%s: With always sends %d arguments, its header requires %d", d.File, d.required, h.Required))
		}
	}
	return out
}

// With sends the fields in order, spreads a list, and leaves out the
// optional ones from the last while they are zero, no others.
func TestWith(t *testing.T) {
	keys := []interface{}{"{n}:meta", "{n}:tokens", "{n}:leases", "{n}:holders", "{n}:waits", "{n}:pend:a"}
	args := AcquireArgs{Size: 2, AcqID: "a", TTLMs: 1000, BlockMs: 5, GraceMs: 100, TombMs: 100, Phase: "fresh"}
	r := Acquire.With(keys, args)
	assert.Same(t, Acquire.Script, r.Script)
	assert.Equal(t, append(keys[:6:6], 2, "a", int64(1000), "", int64(5), int64(100), int64(100), "fresh"), r.KeysAndArgs)
	args.SizeMode = "adopt"
	assert.Len(t, Acquire.With(keys, args).KeysAndArgs, 6+9)
	args.SizeMode, args.IdleMs = "", 60000
	got := Acquire.With(keys, args).KeysAndArgs
	assert.Equal(t, []interface{}{"", int64(60000)}, got[6+8:], "sizeMode sent as \"\" so that idleMs is the tenth")

	rel := Release.With(keys[:4], ReleaseArgs{Token: "e:1", AcqID: "a", Others: []string{"e:2", "e:3"}}).KeysAndArgs
	assert.Equal(t, []interface{}{"e:1", "a", "e:2", "e:3"}, rel[4:])
	one := Release.With(keys[:4], ReleaseArgs{Token: "e:1", AcqID: "a"}).KeysAndArgs
	assert.Equal(t, []interface{}{"e:1", "a"}, one[4:])
	// Required fields are sent even when zero.
	ab := Abort.With(keys, AbortArgs{AcqID: "a"}).KeysAndArgs
	assert.Equal(t, []interface{}{"a", "", int64(0)}, ab[6:])
	assert.Len(t, Status.With(keys[:5], NoArgs{}).KeysAndArgs, 5)
}

// headerKeys returns the key names that lua/<file> lists on its
// "-- KEYS:" header line (a note in parentheses after a name is dropped),
// or an error when it has none.
func headerKeys(file string) ([]string, error) {
	for _, line := range strings.Split(part(file), "\n") {
		rest, ok := strings.CutPrefix(line, "-- KEYS:")
		if !ok {
			continue
		}
		var names []string
		for _, name := range headerNames(rest) {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
	return nil, fmt.Errorf("%s has no \"-- KEYS:\" header", file)
}

// declarations returns every script NewScript has made so far, in order.
func declarations() []Declaration {
	declMu.Lock()
	defer declMu.Unlock()
	return append([]Declaration(nil), declared...)
}

// A fast path's own headers are its script's: a reader of acquire_fast.lua
// or release_fast.lua needs no other file to know what it takes and returns.
func TestFastPathHeaders(t *testing.T) {
	for fast, script := range map[string]string{"acquire_fast.lua": "acquire.lua", "release_fast.lua": "release.lua"} {
		fk, err := headerKeys(fast)
		require.NoError(t, err)
		sk, err := headerKeys(script)
		require.NoError(t, err)
		assert.Equal(t, sk, fk, "%s's KEYS header", fast)
		fa, err := argHeader(fast, part(fast))
		require.NoError(t, err)
		sa, err := argHeader(script, part(script))
		require.NoError(t, err)
		assert.Equal(t, sa, fa, "%s's ARGV header", fast)
	}
}
