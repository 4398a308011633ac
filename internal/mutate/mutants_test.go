package main

import (
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

func applied(m mutant, src string) string { return src[:m.Start] + m.New + src[m.End:] }

// byID applies every mutant of src and keys the results by id.
func byID(t *testing.T, ms []mutant, err error, src string) map[string]string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range ms {
		if _, dup := out[m.ID]; dup {
			t.Errorf("two mutants %s", m.ID)
		}
		out[m.ID] = applied(m, src)
	}
	return out
}

func TestLuaMutants_operators(t *testing.T) {
	src := "-- if a < b then\nlocal s = 'x < 1' .. [[ and ]]\n" +
		"if a <= n - 1 and not b then redis.call('DEL', KEYS[1]) else x = -2 end\n" +
		"local v = redis.call('HSET', k, 'f', 1)\nredis.call('GET', k)"
	want := map[string]string{
		"f:3:6:le2lt":    "if a < n - 1 and not b then",
		"f:3:6:le2gt":    "if a > n - 1 and not b then",
		"f:3:11:sub2add": "if a <= n + 1 and not b then",
		"f:3:13:inc":     "if a <= n - 2 and not b then",
		"f:3:13:dec":     "if a <= n - 0 and not b then",
		"f:3:15:and2or":  "if a <= n - 1 or not b then",
		"f:3:19:notdel":  "if a <= n - 1 and  b then",
		"f:3:4:iftrue":   "if true then",
		"f:3:4:iffalse":  "if false then",
		"f:3:1:swap":     "if a <= n - 1 and not b then x = -2 else redis.call('DEL', KEYS[1]) end",
		"f:3:30:drop":    "if a <= n - 1 and not b then  else x = -2 end",
		"f:3:67:inc":     "else x = -3 end",
		"f:3:67:dec":     "else x = -1 end",
		"f:4:38:inc":     "local v = redis.call('HSET', k, 'f', 2)",
		"f:4:38:dec":     "local v = redis.call('HSET', k, 'f', 0)",
	}
	ms, err := luaMutants("f", src)
	got := byID(t, ms, err, src)
	for id, line := range want {
		if !strings.Contains(got[id], line) {
			t.Errorf("%s: want a line %q in\n%s", id, line, got[id])
		}
		delete(got, id)
	}
	for id := range got {
		t.Errorf("unexpected mutant %s (comments, strings, keys, non-write calls and calls in expressions are left alone)", id)
	}
}

func TestGoMutants_operators(t *testing.T) {
	src := "package p\n\nfunc f(a, b int, c bool) string {\n\tif a < b && !c {\n\t\ta += 1\n\t} else {\n\t\tb--\n\t}\n\treturn \"x\" + \"y\"\n}\n"
	want := map[string]string{
		"f:4:7:lt2le":   "if a <= b && !c {",
		"f:4:7:lt2ge":   "if a >= b && !c {",
		"f:4:11:and2or": "if a < b || !c {",
		"f:4:14:notdel": "if a < b && c {",
		"f:4:5:iftrue":  "if true {",
		"f:4:5:iffalse": "if false {",
		"f:4:2:swap":    "if a < b && !c {\n\t\tb--\n\t} else {\n\t\ta += 1\n\t}",
		"f:5:5:add2sub": "a -= 1",
		"f:5:8:inc":     "a += 2",
		"f:5:8:dec":     "a += 0",
	}
	ms, err := goMutants("f", src)
	got := byID(t, ms, err, src)
	for id, text := range want {
		if !strings.Contains(got[id], text) {
			t.Errorf("%s: want %q in\n%s", id, text, got[id])
		}
		delete(got, id)
	}
	for id := range got {
		t.Errorf("unexpected mutant %s (string concatenation is left alone)", id)
	}
}

// Every mutant of the real sources is a different program that still
// tokenizes (Lua) or parses (Go).
func TestMutants_ofTheSourcesStayWellFormed(t *testing.T) {
	if err := os.Chdir("../.."); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, lang := range []string{"lua", "go"} {
		ms, err := mutants(lang)
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) < 500 {
			t.Fatalf("%s: only %d mutants", lang, len(ms))
		}
		for _, m := range ms {
			ids[m.ID] = true
			b, err := os.ReadFile(m.File)
			if err != nil {
				t.Fatal(err)
			}
			src := applied(m, string(b))
			if src == string(b) {
				t.Errorf("%s changes nothing", m.ID)
			} else if lang == "lua" {
				if _, err := luaTokens(src); err != nil {
					t.Errorf("%s: %v", m.ID, err)
				}
			} else if _, err := parser.ParseFile(token.NewFileSet(), m.File, src, parser.SkipObjectResolution); err != nil {
				t.Errorf("%s: %v", m.ID, err)
			}
		}
	}
	// What killed.txt and survivors.txt record names mutants of the files
	// as they are: an edit that moves a recorded mutant's line or column
	// moves its id too.
	for _, f := range []string{"internal/mutate/killed.txt", "internal/mutate/survivors.txt"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(line); len(fs) > 0 && !strings.HasPrefix(fs[0], "#") && !ids[fs[0]] {
				t.Errorf("%s:%d: %s is no mutant of the files now (-list prints the ids)", f, n+1, fs[0])
			}
		}
	}
}
