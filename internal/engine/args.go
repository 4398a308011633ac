package engine

import (
	"fmt"

	"github.com/gomodule/redigo/redis"
)

// Arg is one argument of a script call, under the name the script's
// "-- ARGV:" header gives it.
type Arg struct {
	Name  string
	Value interface{}
}

// A is the argument name = v.
func A(name string, v interface{}) Arg { return Arg{Name: name, Value: v} }

// Rest is what follows the named arguments of a script whose header ends in
// a "then ..." item (the other tokens of a lease, a limit's values): any
// number of values, spread after the named ones.
func Rest(vs ...interface{}) Arg { return Arg{Name: restName, Value: vs} }

// RestStrings is Rest of strings.
func RestStrings(vs []string) Arg {
	out := make([]interface{}, len(vs))
	for i, v := range vs {
		out[i] = v
	}
	return Rest(out...)
}

const restName = "then ..."

// badArgs ends the keys and arguments Args built for a call whose names are
// not its script's: RunScript, Call and BlockThenRun refuse such a call
// before anything is sent (ErrArity).
type badArgs struct{ why string }

// Args returns the keys and arguments of a call of script: keys, then the
// value of each argument. The arguments must be named as the script's
// "-- ARGV:" header names them, in its order: all of the required ones, of
// the optional ones any first few, then Rest if the header has a "then"
// item. A call named otherwise is refused before anything is sent, with
// ErrArity saying which name differs; so the Go side of every call states
// each argument by name and cannot shift one against the script.
func Args(script *redis.Script, keys []interface{}, args ...Arg) []interface{} {
	declMu.Lock()
	d, ok := arity[script]
	declMu.Unlock()
	out := make([]interface{}, 0, len(keys)+len(args)+4)
	out = append(out, keys...)
	var bad string
	refuse := func(format string, v ...interface{}) {
		if ok && bad == "" {
			bad = fmt.Sprintf(format, v...)
		}
	}
	i := 0
	for j, a := range args {
		if a.Name == restName {
			switch {
			case !d.args.Rest:
				refuse("values after its arguments, which its header does not take")
			case j != len(args)-1:
				refuse("values before its argument %q", args[j+1].Name)
			}
			out = append(out, a.Value.([]interface{})...)
			continue
		}
		switch {
		case i >= len(d.args.Names):
			refuse("argument %q after its %d", a.Name, len(d.args.Names))
		case d.args.Names[i] != a.Name:
			refuse("argument %d is %q, called as %q", i+1, d.args.Names[i], a.Name)
		}
		i++
		out = append(out, a.Value)
	}
	if i < d.args.Required {
		refuse("argument %q left out", d.args.Names[i])
	}
	if bad != "" {
		out = append(out, badArgs{bad})
	}
	return out
}
