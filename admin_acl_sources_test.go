package redsem

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redsem/redsem/admin"
)

var (
	// redis.call('CMD' / redis.pcall("CMD": a command the script names.
	luaLiteralCall = regexp.MustCompile(`redis\.p?call\(\s*['"]([A-Za-z|]+)['"]`)
	// redis.call(x: a command held in a variable.
	luaDynamicCall = regexp.MustCompile(`redis\.p?call\(\s*([A-Za-z_][A-Za-z0-9_]*)`)
	// local function name(a, b, c)
	luaFunction = regexp.MustCompile(`^\s*(?:local\s+)?function\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(([^)]*)\)`)
	// Any redis.call/pcall at all, to count the ones the two above missed.
	luaAnyCall = regexp.MustCompile(`redis\.p?call\(`)

	// conn.Send("CMD", redis.DoContext(conn, ctx, "CMD", c.Do("CMD": a
	// command the Go code sends by name.
	goLiteralSend = regexp.MustCompile(`\b(?:Send|Do|DoContext|do)\(\s*(?:[A-Za-z_][A-Za-z0-9_.]*\s*,\s*)*"([A-Za-z ]+)"`)
	// "SCRIPT", "LOAD": a command and its subcommand as two literals.
	goSubcommand = regexp.MustCompile(`"SCRIPT",\s*"([A-Za-z]+)"`)
	// Every Send/Do/DoContext call, to count the ones that name no literal.
	goAnySend = regexp.MustCompile(`\b(?:Send|Do|DoContext|do)\(`)
	// engine.Acquire.SendHash(: a script method, which sends EVALSHA/EVAL.
	goScriptCall = regexp.MustCompile(`\b([A-Za-z_]*[sS]cript)\.([A-Za-z]+)\(`)
)

// relays are the lines that send a command their caller named: a Script
// sends through them the commands of scriptMethodCommands.
var relays = map[string]bool{
	"return redis.DoContext(conn, ctx, cmd, args...)": true,
}

// scriptMethodCommands are what the methods of an *engine.Script send
// (internal/engine/script.go): SCRIPT LOAD
// for a script's first run in a process, EVALSHA, then EVAL on NOSCRIPT.
var scriptMethodCommands = map[string][]string{
	"Do":        {"script|load", "evalsha", "eval"},
	"DoContext": {"script|load", "evalsha", "eval"},
	"DoUntil":   {"script|load", "evalsha", "eval"},
	"Load":      {"script|load"},
	"hashOn":    {"script|load"},
	"Hash":      nil, // sends nothing
	"With":      nil, // builds a call, which RunScript or Call sends
	"args":      nil,
}

// luaCommands returns the commands the scripts in internal/engine/lua/ call: every
// redis.call/redis.pcall whose first argument is a string, and for a call
// whose command is a parameter of the enclosing function ("local function
// get(key, want, cmd, ...)" in status.lua), the string each call of that
// function passes in that position. A call it cannot resolve fails t.
func luaCommands(t *testing.T) map[string][]string {
	files, err := filepath.Glob("internal/engine/lua/*.lua")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	found := map[string][]string{} // command -> files
	add := func(cmd, where string) {
		cmd = strings.ToLower(cmd)
		found[cmd] = append(found[cmd], where)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		src := string(b)
		// Which parameter of which function carries a command.
		wrappers := map[string]int{}
		fn, params := "", []string(nil)
		for i, line := range strings.Split(src, "\n") {
			code := stripLuaComment(line)
			if m := luaFunction.FindStringSubmatch(code); m != nil {
				fn, params = m[1], splitParams(m[2])
			}
			total := len(luaAnyCall.FindAllString(code, -1))
			lit := luaLiteralCall.FindAllStringSubmatch(code, -1)
			for _, m := range lit {
				add(m[1], f)
			}
			resolved := len(lit)
			for _, m := range luaDynamicCall.FindAllStringSubmatch(code, -1) {
				idx := indexOf(params, m[1])
				if !assert.GreaterOrEqual(t, idx, 0, "%s:%d: redis.call(%s ...) with a command that is not a parameter of the enclosing function %q: teach this test where it comes from",
					f, i+1, m[1], fn) {
					continue
				}
				wrappers[fn] = idx
				resolved++
			}
			assert.Equal(t, total, resolved, "%s:%d: a redis.call this test cannot read: %s", f, i+1, strings.TrimSpace(line))
		}
		for name, idx := range wrappers {
			calls := regexp.MustCompile(`\b`+regexp.QuoteMeta(name)+`\(`).FindAllStringIndex(src, -1)
			n := 0
			for _, c := range calls {
				args := callArgs(src[c[1]:])
				if strings.Contains(src[max(0, c[0]-15):c[0]], "function") {
					continue // the definition
				}
				n++
				if !assert.Greater(t, len(args), idx, "%s: %s(%s) passes no command", f, name, strings.Join(args, ",")) {
					continue
				}
				a := strings.TrimSpace(args[idx])
				if !assert.Regexp(t, `^'[A-Za-z]+'$`, a, "%s: %s passes command %s, not a string", f, name, a) {
					continue
				}
				add(strings.Trim(a, "'"), f)
			}
			assert.Positive(t, n, "%s: %s is never called", f, name)
		}
	}
	return found
}

func stripLuaComment(line string) string {
	if i := strings.Index(line, "--"); i >= 0 {
		return line[:i]
	}
	return line
}

func splitParams(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		out = append(out, strings.TrimSpace(p))
	}
	return out
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// callArgs splits the arguments of the call whose "(" precedes s, at the
// commas outside brackets and strings.
func callArgs(s string) []string {
	var args []string
	depth, start := 0, 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			if depth == 0 {
				return append(args, s[start:i])
			}
			depth--
		case c == ',' && depth == 0:
			args = append(args, s[start:i])
			start = i + 1
		}
	}
	return args
}

// goCommands returns the commands the package's Go code (not its tests)
// sends: by name through Send/Do/DoContext, and EVALSHA/EVAL through the
// methods of its scripts. A Send/Do whose command is not a string literal
// fails t.
func goCommands(t *testing.T) map[string][]string {
	// The packages a semaphore, mutex or rate gate runs: this one, the rate
	// gate's and the engine they share, and admin's. (cluster, sentinel and goredis talk
	// to Redis about routing and connections: their docs list what they add.)
	var files []string
	for _, dir := range []string{".", "rate", "internal/engine", "admin"} {
		fs, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, fs, dir)
		files = append(files, fs...)
	}
	found := map[string][]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			code := line
			if j := strings.Index(code, "//"); j >= 0 {
				code = code[:j]
			}
			if strings.HasPrefix(code, "func ") {
				// A declaration (Script's Do, DoContext) is no call: scan
				// only what follows its signature, a one-line body.
				_, code, _ = strings.Cut(code, "{")
			}
			if relays[strings.TrimSpace(code)] {
				continue
			}
			scripts := goScriptCall.FindAllStringSubmatch(code, -1)
			for _, m := range scripts {
				cmds, ok := scriptMethodCommands[m[2]]
				if !assert.True(t, ok, "%s:%d: %s.%s: which commands does it send?", f, i+1, m[1], m[2]) {
					continue
				}
				for _, c := range cmds {
					found[c] = append(found[c], f)
				}
			}
			lits := goLiteralSend.FindAllStringSubmatch(code, -1)
			for _, m := range lits {
				cmd := strings.ToLower(strings.Fields(m[1])[0])
				if f := strings.Fields(m[1]); len(f) > 1 { // "SCRIPT LOAD" style
					cmd = strings.ToLower(f[0] + "|" + f[1])
				}
				if sub := goSubcommand.FindStringSubmatch(code); cmd == "script" && sub != nil {
					cmd += "|" + strings.ToLower(sub[1]) // do("SCRIPT", "LOAD", ...)
				}
				found[cmd] = append(found[cmd], f)
			}
			// Script method calls are Send/Do calls too; what remains must
			// have named its command.
			sends := len(goAnySend.FindAllString(code, -1))
			scriptSends := 0
			for _, m := range scripts {
				if m[2] == "Send" || m[2] == "Do" || m[2] == "DoContext" {
					scriptSends++
				}
			}
			assert.Equal(t, sends, len(lits)+scriptSends,
				"%s:%d: a Send/Do whose command this test cannot read: %s", f, i+1, strings.TrimSpace(line))
		}
	}
	return found
}

// The list ACLCommands returns is exactly what the sources send: every
// command of every script and of the Go client is in it (else the ACL user
// fails at run time), and it holds nothing they do not send (least
// privilege). INFO, sent only by CheckServer, and SCAN, sent only by the
// fleet view, are optional by design.
func TestAdmin_ACLCommands_matchSources(t *testing.T) {
	t.Parallel()
	used := luaCommands(t)
	for cmd, where := range goCommands(t) {
		used[cmd] = append(used[cmd], where...)
	}
	optional := map[string]bool{"info": true, "scan": true}
	listed := map[string]bool{}
	for _, c := range admin.ACLCommands() {
		listed[c] = true
	}
	var missing, unused []string
	for cmd, where := range used {
		if !listed[cmd] && !optional[cmd] {
			missing = append(missing, cmd+" (in "+strings.Join(dedupe(where), ", ")+")")
		}
	}
	for cmd := range listed {
		if _, ok := used[cmd]; !ok {
			unused = append(unused, cmd)
		}
	}
	sort.Strings(missing)
	sort.Strings(unused)
	assert.Empty(t, missing, "commands the sources send that ACLCommands lacks")
	assert.Empty(t, unused, "commands in ACLCommands that nothing sends")
	// The derivation itself must see the commands it is known to find, or
	// a broken regexp would pass by finding nothing.
	for _, c := range []string{"blmove", "blpop", "evalsha", "eval", "info", "hgetall", "lrem", "lindex", "pexpire", "hkeys"} {
		assert.Contains(t, used, c, "the scan of the sources found no %s", c)
	}
}

func dedupe(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

func TestAdmin_ACLCommands_sortedLowerCase(t *testing.T) {
	t.Parallel()
	cmds := admin.ACLCommands()
	assert.True(t, sort.StringsAreSorted(cmds))
	for _, c := range cmds {
		assert.Equal(t, strings.ToLower(c), c)
	}
	cmds[0] = "changed"
	assert.NotEqual(t, "changed", admin.ACLCommands()[0], "ACLCommands returns a copy")
}
