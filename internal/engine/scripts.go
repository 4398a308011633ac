package engine

import (
	"embed"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/gomodule/redigo/redis"
)

//go:embed lua/*.lua
var luaFS embed.FS

// NewScript returns the script in lua/<file> taking keys keys, after the
// files of helpers it uses (Redis scripts cannot import one another), in
// order: codes.lua (the reply codes) always first, then helpers (see
// registry.go). redigo runs it with EVALSHA and falls back to EVAL on
// NOSCRIPT.
//
// Each call is recorded (Declarations), so that a test can hold what Go
// declares against each script's own "-- KEYS:" header (HeaderKeys). The
// script's "-- ARGV:" header (HeaderArgs) sets how many arguments it takes:
// RunScript, Call and BlockThenRun refuse a call of it with any other count
// before anything is sent (ErrArity), so an argument added on one side only
// fails the first test that runs the call instead of shifting every
// argument after it.
func NewScript(keys int, file string, helpers ...string) *redis.Script {
	helpers = append([]string{"codes.lua"}, helpers...)
	d := Declaration{File: file, Keys: keys, Helpers: helpers, MinArgs: -1}
	if h, err := HeaderArgNames(file); err == nil {
		d.MinArgs, d.MaxArgs, d.args = h.Required, len(h.Names), h
		if h.Rest {
			d.MaxArgs = Variadic
		}
	}
	script := redis.NewScript(keys, compose(file, helpers))
	declMu.Lock()
	declared = append(declared, d)
	arity[script] = d
	declMu.Unlock()
	return script
}

func compose(file string, helpers []string) string {
	var src string
	for _, h := range helpers {
		src += MustRead(h) + "\n"
	}
	return src + MustRead(file)
}

// Source returns the source of the declared script lua/<file> as Redis
// runs it, after its helpers; it panics when no script is declared so.
func Source(file string) string {
	for _, d := range Declarations() {
		if d.File == file {
			return compose(file, d.Helpers)
		}
	}
	panic("redsem: no script declared as " + file)
}

// Variadic is Declaration.MaxArgs for a script whose arguments end in a
// list of any length.
const Variadic = 1 << 20

// ErrArity is a call of a script with more or fewer arguments than its
// "-- ARGV:" header lists: a bug in redsem, never sent to Redis.
var ErrArity = errors.New("redsem: internal error: script called with the wrong number of arguments")

// checkArity returns ErrArity, wrapped with the script and the counts, when
// keysAndArgs does not fit script's declaration.
func checkArity(script *redis.Script, keysAndArgs []interface{}) error {
	declMu.Lock()
	d, ok := arity[script]
	declMu.Unlock()
	if n := len(keysAndArgs); n > 0 {
		if bad, isBad := keysAndArgs[n-1].(badArgs); isBad {
			return fmt.Errorf("%w: %s: %s", ErrArity, d.File, bad.why)
		}
	}
	if !ok || d.MinArgs < 0 {
		return nil
	}
	if n := len(keysAndArgs) - d.Keys; n < d.MinArgs || n > d.MaxArgs {
		return fmt.Errorf("%w: %s takes %d keys and %s arguments, called with %d values",
			ErrArity, d.File, d.Keys, d.argRange(), len(keysAndArgs))
	}
	return nil
}

func (d Declaration) argRange() string {
	switch {
	case d.MaxArgs == Variadic:
		return fmt.Sprintf("%d or more", d.MinArgs)
	case d.MaxArgs != d.MinArgs:
		return fmt.Sprintf("%d to %d", d.MinArgs, d.MaxArgs)
	}
	return fmt.Sprint(d.MinArgs)
}

// HeaderArgs returns how many arguments lua/<file> takes by its "-- ARGV:"
// header (HeaderArgNames): the names from "and optionally" on may be left
// out, from the last (max counts them, min does not); with a "then" item,
// any number may follow (max is Variadic).
func HeaderArgs(file string) (min, max int, err error) {
	h, err := HeaderArgNames(file)
	if err != nil {
		return 0, 0, err
	}
	min, max = h.Required, len(h.Names)
	if h.Rest {
		max = Variadic
	}
	return min, max, nil
}

// ArgHeader is a script's "-- ARGV:" header: the names of its arguments in
// order, how many of them a call must give (the rest are optional, left
// out from the last), and whether any number of values may follow them.
type ArgHeader struct {
	Names    []string
	Required int
	Rest     bool
}

// HeaderArgNames reads the "-- ARGV:" header of lua/<file>: the names
// listed, separated by commas (notes in parentheses dropped), over the
// header line and the indented comment lines that continue it. "none" is
// no argument; "and optionally" before a name makes it and every name
// after it optional; an item starting with "then" says that any number of
// values follow (it and what comes after it are not names).
func HeaderArgNames(file string) (ArgHeader, error) {
	var h ArgHeader
	var text string
	in := false
	for _, line := range strings.Split(MustRead(file), "\n") {
		if rest, ok := strings.CutPrefix(line, "-- ARGV:"); ok {
			text, in = rest, true
			continue
		}
		if !in {
			continue
		}
		rest, ok := strings.CutPrefix(line, "--   ")
		if !ok {
			break
		}
		text += " " + rest
	}
	if !in {
		return h, fmt.Errorf("%s has no \"-- ARGV:\" header", file)
	}
	if strings.TrimSpace(text) == "none" {
		return h, nil
	}
	optional := false
	for _, it := range headerNames(text) {
		switch {
		case it == "":
			return ArgHeader{}, fmt.Errorf("%s: an empty name in its \"-- ARGV:\" header", file)
		case strings.HasPrefix(it, "then "):
			h.Rest = true
			return h, nil
		}
		if name, ok := strings.CutPrefix(it, "and optionally "); ok {
			it, optional = name, true
		}
		h.Names = append(h.Names, it)
		if !optional {
			h.Required++
		}
	}
	return h, nil
}

// MustRead returns the source of lua/<file>; it panics when there is no
// such file, which is a build mistake.
func MustRead(file string) string {
	b, err := luaFS.ReadFile("lua/" + file)
	if err != nil {
		panic("redsem: missing embedded script " + file)
	}
	return string(b)
}

// Declaration is a script as Go declares it: its file, how many of its
// arguments are keys, and the helper files it runs after; and how many
// other arguments it takes by its header (MinArgs -1: the header could not
// be read, which TestScriptHeadersMatchDeclarations reports).
type Declaration struct {
	File             string
	Keys             int
	Helpers          []string
	MinArgs, MaxArgs int
	args             ArgHeader
}

var (
	declMu   sync.Mutex
	declared []Declaration
	arity    = map[*redis.Script]Declaration{}
)

// Declarations returns every script NewScript has made so far, in order.
func Declarations() []Declaration {
	declMu.Lock()
	defer declMu.Unlock()
	return append([]Declaration(nil), declared...)
}

// HeaderKeys returns the key names that lua/<file> lists on its
// "-- KEYS:" header line (a note in parentheses after a name is dropped),
// or an error when it has none.
func HeaderKeys(file string) ([]string, error) {
	for _, line := range strings.Split(MustRead(file), "\n") {
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

// headerNames splits a header's list at the commas outside parentheses and
// drops the parenthesised notes: "a (x, y), b" is "a", "b". An empty item
// (two commas in a row) is kept, as "".
func headerNames(text string) []string {
	depth, cur := 0, ""
	var items []string
	for _, r := range text + "," {
		switch {
		case r == '(':
			depth++
		case r == ')':
			depth--
		case r == ',' && depth == 0:
			items = append(items, strings.TrimSpace(cur))
			cur = ""
		case depth == 0:
			cur += string(r)
		}
	}
	return items
}
