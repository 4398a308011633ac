package engine

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The scripts stay small enough to read: no file in lua/ is longer than
// maxLuaLines lines, and no block nests deeper than maxLuaDepth (every
// function, if, for, while, repeat and do block counts, a top-level
// do ... end too). None has a long bracket ([[ or [=[, a long string or
// comment), so that wire may take every line starting with "--" for a
// comment. No assignment puts an "and" right after a call or an index
// (x = f() and y): gopher-lua, which miniredis runs, gets that wrong (it
// keeps x's old value when f() is false or nil), so the explorer would
// check a script that Redis runs otherwise.
const (
	maxLuaLines = 300
	maxLuaDepth = 4
)

var longBracketOpen = regexp.MustCompile(`\[=*\[`)

func TestLuaShape(t *testing.T) {
	files, err := filepath.Glob("lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		if longBracketOpen.MatchString(src) {
			t.Errorf("%s: a long bracket", f)
		}
		if n := strings.Count(src, "\n"); n > maxLuaLines {
			t.Errorf("%s: %d lines, more than %d", f, n, maxLuaLines)
		}
		for i, l := range strings.Split(src, "\n") {
			if name := andAfterCall(l); name != "" {
				t.Errorf("%s:%d: %s assigned a call's or an index's value followed by and (gopher-lua gets it wrong)", f, i+1, name)
			}
		}
		depth, line, err := luaMaxDepth(src)
		if err != nil {
			t.Errorf("%s: %v", f, err)
		} else if depth > maxLuaDepth {
			t.Errorf("%s:%d: nested %d deep, more than %d", f, line, depth, maxLuaDepth)
		}
	}
}

var (
	luaAssign   = regexp.MustCompile(`(?:^|[^\w.=~<>:])([A-Za-z_]\w*)\s*=([^=].*)$`)
	luaStmtEnd  = regexp.MustCompile(`\b(then|do|else|elseif|end)\b`)
	luaOperand  = regexp.MustCompile(`\b(and|or)\b`)
	luaString   = regexp.MustCompile(`'[^']*'|"[^"]*"`)
	luaLocal    = regexp.MustCompile(`\blocal\s+(\w+\s*,\s*)*$`)
	luaBareName = regexp.MustCompile(`^[A-Za-z_]\w*$`)
	luaCompare  = regexp.MustCompile(`==|~=|<|>|^not\b`)
)

// andAfterCall returns the target of an assignment on line (comments and
// strings aside; a local's declaration and a table's field are not
// assignments) whose value has an "and" right after a call or an index
// (x = f() and y, x = t.k and y): gopher-lua keeps x's old value there
// when the left side is false or nil. A comparison, a "not" or a plain
// name before the "and" is safe. It reads one line: a statement split
// over lines goes unchecked.
func andAfterCall(line string) string {
	code, _, _ := strings.Cut(luaString.ReplaceAllString(line, "''"), "--")
	for off := 0; off < len(code); {
		m := luaAssign.FindStringSubmatchIndex(code[off:])
		if m == nil {
			return ""
		}
		name, rhs := code[off+m[2]:off+m[3]], code[off+m[4]:off+m[5]]
		before := code[:off+m[2]]
		off += m[4]
		if luaLocal.MatchString(before) || strings.Count(before, "{") > strings.Count(before, "}") {
			continue
		}
		if e := luaStmtEnd.FindStringIndex(rhs); e != nil {
			rhs = rhs[:e[0]]
		}
		rhs, _, _ = strings.Cut(rhs, ";")
		from := 0
		for _, op := range luaOperand.FindAllStringSubmatchIndex(rhs, -1) {
			left := strings.TrimSpace(rhs[from:op[0]])
			from = op[1]
			if rhs[op[2]:op[3]] != "and" || luaBareName.MatchString(left) || luaCompare.MatchString(left) {
				continue
			}
			return name
		}
	}
	return ""
}

func TestLuaAndAfterCall(t *testing.T) {
	for line, want := range map[string]string{
		"all = refund(st, i, acq, w[i]) and all":                            "all",
		"      if w[i] > 0 then all = refund(st, i, acq, w[i]) and all end": "all",
		"str = f() and str or str":                                          "str",
		"x = f() and y":                                                     "x",
		"x = t.k and y":                                                     "x",
		"x = y and f() and y":                                               "x",
		"x = (f()) and y":                                                   "x",
		"a, b = f() and y, 1":                                               "b",
		"x = y; z = f() and x":                                              "z",
		"elseif c then x = f() and y end":                                   "x",
		"busy = busy or #live == 1000":                                      "",
		"x = f() or x":                                                      "",
		"x = y and x":                                                       "",
		"x = a == b and x":                                                  "",
		"ok = n < #size and ok":                                             "",
		"x = not f() and y":                                                 "",
		"local seal = parse_seal(msize and redis.call('HGET', k, 'seal'))": "",
		"local all = f() and all":        "",
		"local a, b = f() and b":         "",
		"local t = {a = f() and a}":      "",
		"if a == b and b then x = 1 end": "",
		"x = y and z -- and f() and x":   "",
		"s = 'f() and x' .. y":           "",
	} {
		if got := andAfterCall(line); got != want {
			t.Errorf("%q: %q, want %q", line, got, want)
		}
	}
}

func TestLuaMaxDepth(t *testing.T) {
	for src, want := range map[string]int{
		"local x = 1":                                        0,
		"do end":                                             1,
		"if a then elseif b then else end":                   1,
		"for i = 1, 2 do while x do end end":                 2,
		"local f = function() repeat until x end":            2,
		"-- if if if\nlocal s = 'do end' .. [[ if ]]":        0,
		"--[[ for\n]] function f() if a then do end end end": 3,
		"local t = {['end'] = 1}; if t.if_ then end":         1,
	} {
		got, _, err := luaMaxDepth(src)
		if err != nil || got != want {
			t.Errorf("%q: depth %d, %v; want %d", src, got, err, want)
		}
	}
	for _, bad := range []string{"if a then", "end", "for i = 1, 2 do", "repeat end"} {
		if _, _, err := luaMaxDepth(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// luaMaxDepth returns the deepest nesting of blocks in src and the line
// where it is first reached. Comments and strings are skipped; the do of
// a for or while loop is part of that loop, not a block of its own.
func luaMaxDepth(src string) (max, at int, err error) {
	var stack []string
	line, loopDo := 1, 0
	i := 0
	for i < len(src) {
		c := src[i]
		switch {
		case c == '\n':
			line++
			i++
		case strings.HasPrefix(src[i:], "--"):
			i += 2
			if n := longBracket(src[i:]); n > 0 {
				i += n
				line += strings.Count(src[i-n:i], "\n")
			} else {
				for i < len(src) && src[i] != '\n' {
					i++
				}
			}
		case c == '[' && longBracket(src[i:]) > 0:
			n := longBracket(src[i:])
			line += strings.Count(src[i:i+n], "\n")
			i += n
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				j++
			}
			i = j + 1
		case isIdentStart(c):
			j := i
			for j < len(src) && (isIdentStart(src[j]) || src[j] >= '0' && src[j] <= '9') {
				j++
			}
			word := src[i:j]
			if i > 0 && (src[i-1] == '.' || src[i-1] == ':') {
				word = "" // a field or method name, not a keyword
			}
			i = j
			switch word {
			case "for", "while":
				stack = append(stack, word)
				loopDo++
			case "do":
				if loopDo > 0 {
					loopDo--
					break
				}
				stack = append(stack, word)
			case "function", "if", "repeat":
				stack = append(stack, word)
			case "end", "until":
				if len(stack) == 0 || (word == "until") != (stack[len(stack)-1] == "repeat") {
					return 0, 0, fmt.Errorf("line %d: unbalanced %s", line, word)
				}
				stack = stack[:len(stack)-1]
			}
			if len(stack) > max {
				max, at = len(stack), line
			}
		default:
			i++
		}
	}
	if len(stack) > 0 {
		return 0, 0, fmt.Errorf("%d blocks left open", len(stack))
	}
	return max, at, nil
}

// longBracket returns the length of the long string or comment ([[ ... ]],
// [==[ ... ]==]) that s starts with, or 0.
func longBracket(s string) int {
	if len(s) < 2 || s[0] != '[' {
		return 0
	}
	eq := 1
	for eq < len(s) && s[eq] == '=' {
		eq++
	}
	if eq >= len(s) || s[eq] != '[' {
		return 0
	}
	closing := "]" + strings.Repeat("=", eq-1) + "]"
	end := strings.Index(s[eq+1:], closing)
	if end < 0 {
		return len(s)
	}
	return eq + 1 + end + len(closing)
}

func isIdentStart(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
