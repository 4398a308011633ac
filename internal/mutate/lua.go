package main

import (
	"fmt"
	"strconv"
	"strings"
)

// A Lua token, as far as the mutation operators need one: comments and
// whitespace are skipped, a string (quoted or long-bracketed) is one token.
type luaToken struct {
	kind  byte // 'n' name or keyword, '0' number, 's' string, 'o' operator
	text  string
	off   int // byte offset of its first byte
	line  int
	col   int
	close int // offset after its last byte
}

// luaTokens splits src into tokens; it fails on an unterminated string or
// comment, so a mutant is never made inside one.
func luaTokens(src string) ([]luaToken, error) {
	var toks []luaToken
	line, lineStart := 1, 0
	i := 0
	// skip moves i to j, counting the lines it passes.
	skip := func(j int) {
		for k := i; k < j && k < len(src); k++ {
			if src[k] == '\n' {
				line, lineStart = line+1, k+1
			}
		}
		i = j
	}
	for i < len(src) {
		c := src[i]
		start := luaToken{off: i, line: line, col: i - lineStart + 1}
		switch {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			skip(i + 1)
			continue
		case strings.HasPrefix(src[i:], "--"):
			if n := longBracket(src[i+2:]); n > 0 {
				end := strings.Index(src[i+2+n:], "]"+strings.Repeat("=", n-2)+"]")
				if end < 0 {
					return nil, fmt.Errorf("line %d: unterminated comment", line)
				}
				skip(i + 2 + n + end + n)
			} else if nl := strings.IndexByte(src[i:], '\n'); nl >= 0 {
				skip(i + nl)
			} else {
				skip(len(src))
			}
			continue
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				} else if src[j] == '\n' {
					return nil, fmt.Errorf("line %d: unterminated string", line)
				}
				j++
			}
			if j >= len(src) {
				return nil, fmt.Errorf("line %d: unterminated string", line)
			}
			start.kind, start.text = 's', src[i:j+1]
			skip(j + 1)
		case c == '[' && longBracket(src[i:]) > 0:
			n := longBracket(src[i:])
			end := strings.Index(src[i+n:], "]"+strings.Repeat("=", n-2)+"]")
			if end < 0 {
				return nil, fmt.Errorf("line %d: unterminated long string", line)
			}
			start.kind, start.text = 's', src[i:i+n+end+n]
			skip(i + n + end + n)
		case isDigit(c) || c == '.' && i+1 < len(src) && isDigit(src[i+1]):
			j := i
			for j < len(src) && (isNameByte(src[j]) || src[j] == '.' ||
				(src[j] == '-' || src[j] == '+') && (src[j-1] == 'e' || src[j-1] == 'E') && !strings.HasPrefix(src[i:], "0x")) {
				j++
			}
			start.kind, start.text = '0', src[i:j]
			skip(j)
		case isNameByte(c):
			j := i
			for j < len(src) && isNameByte(src[j]) {
				j++
			}
			start.kind, start.text = 'n', src[i:j]
			skip(j)
		default:
			n := 1
			for _, op := range []string{"...", "..", "==", "~=", "<=", ">=", "::"} {
				if strings.HasPrefix(src[i:], op) {
					n = len(op)
					break
				}
			}
			start.kind, start.text = 'o', src[i:i+n]
			skip(i + n)
		}
		start.close = i
		toks = append(toks, start)
	}
	return toks, nil
}

// longBracket returns the length of the opening long bracket ([[, [=[, ...)
// at the start of s, or 0.
func longBracket(s string) int {
	if !strings.HasPrefix(s, "[") {
		return 0
	}
	n := 1
	for n < len(s) && s[n] == '=' {
		n++
	}
	if n < len(s) && s[n] == '[' {
		return n + 1
	}
	return 0
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isNameByte(c byte) bool {
	return c == '_' || isDigit(c) || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// The relational operators' names in mutant ids, and what each becomes:
// its boundary neighbour, then its negation.
var (
	relName = map[string]string{"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "~=": "ne", "!=": "ne"}
	relTo   = map[string][]string{"<": {"<=", ">="}, "<=": {"<", ">"}, ">": {">=", "<="}, ">=": {">", "<"},
		"==": {"~="}, "~=": {"=="}}
)

// luaWrites are the Redis commands whose redis.call, as a statement, the
// "drop" operator removes.
var luaWrites = map[string]bool{"DEL": true, "UNLINK": true, "HSET": true, "HSETNX": true, "HDEL": true,
	"HINCRBY": true, "ZADD": true, "ZREM": true, "ZINCRBY": true, "ZREMRANGEBYSCORE": true, "LPUSH": true,
	"RPUSH": true, "LPOP": true, "RPOP": true, "LREM": true, "LTRIM": true, "LMOVE": true, "SET": true,
	"INCR": true, "INCRBY": true, "EXPIRE": true, "PEXPIRE": true, "PEXPIREAT": true, "PERSIST": true}

// luaBlockOpeners start a block that ends with end (or, for repeat, until).
var luaBlockOpeners = map[string]bool{"if": true, "for": true, "while": true, "function": true, "do": true, "repeat": true}

// luaMutants returns every mutant of the Lua source src of file.
func luaMutants(file, src string) ([]mutant, error) {
	toks, err := luaTokens(src)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	var ms []mutant
	add := func(t luaToken, op string, start, end int, repl string) {
		ms = append(ms, mutant{ID: fmt.Sprintf("%s:%d:%d:%s", file, t.line, t.col, op),
			File: file, Start: start, End: end, New: repl})
	}
	for k, t := range toks {
		switch {
		case t.kind == 'o' && relTo[t.text] != nil:
			for _, to := range relTo[t.text] {
				add(t, relName[t.text]+"2"+relName[to], t.off, t.close, to)
			}
		case t.kind == 'o' && (t.text == "+" || t.text == "-") && k > 0 && luaEndsOperand(toks[k-1]):
			to := map[string]string{"+": "-", "-": "+"}[t.text]
			if to == "-" && t.close < len(src) && src[t.close] == '-' {
				to = "- " // a+-1 must not become the comment a--1
			}
			add(t, map[string]string{"+": "add2sub", "-": "sub2add"}[t.text], t.off, t.close, to)
		case t.kind == '0':
			n, err := strconv.Atoi(t.text)
			if err != nil || k >= 2 && toks[k-1].text == "[" && (toks[k-2].text == "KEYS" || toks[k-2].text == "ARGV") {
				continue // a float or hex literal, or which key or argument: left alone
			}
			add(t, "inc", t.off, t.close, strconv.Itoa(n+1))
			dec := strconv.Itoa(n - 1)
			if n == 0 {
				dec = "(-1)"
			}
			add(t, "dec", t.off, t.close, dec)
		case t.kind == 'n' && (t.text == "and" || t.text == "or"):
			to := map[string]string{"and": "or", "or": "and"}[t.text]
			add(t, t.text+"2"+to, t.off, t.close, to)
		case t.kind == 'n' && t.text == "not":
			add(t, "notdel", t.off, t.close, "")
		case t.kind == 'n' && (t.text == "if" || t.text == "elseif"):
			then := k + 1
			for then < len(toks) && !(toks[then].kind == 'n' && toks[then].text == "then") {
				then++
			}
			if then >= len(toks) || then == k+1 {
				continue
			}
			cond := toks[k+1]
			add(cond, "iftrue", cond.off, toks[then-1].close, "true")
			add(cond, "iffalse", cond.off, toks[then-1].close, "false")
			if t.text == "if" {
				if m, ok := luaSwap(file, src, toks, k, then); ok {
					ms = append(ms, m)
				}
			}
		case t.kind == 'n' && t.text == "redis" && k+4 < len(toks) && toks[k+1].text == "." &&
			(toks[k+2].text == "call" || toks[k+2].text == "pcall") && toks[k+3].text == "(" &&
			toks[k+4].kind == 's' && luaWrites[strings.ToUpper(strings.Trim(toks[k+4].text, `'"`))] &&
			(k == 0 || luaStartsStatement(toks[k-1])):
			depth, j := 0, k+3
			for ; j < len(toks); j++ {
				if toks[j].text == "(" {
					depth++
				} else if toks[j].text == ")" {
					if depth--; depth == 0 {
						break
					}
				}
			}
			if j < len(toks) {
				add(t, "drop", t.off, toks[j].close, "")
			}
		}
	}
	return ms, nil
}

// luaEndsOperand reports whether a + or - after t is binary.
func luaEndsOperand(t luaToken) bool {
	switch t.kind {
	case '0', 's':
		return true
	case 'n':
		return !luaKeyword(t.text) || t.text == "true" || t.text == "false" || t.text == "nil"
	}
	return t.text == ")" || t.text == "]" || t.text == "}"
}

// luaStartsStatement reports whether a call after t starts a statement
// (rather than being part of an expression).
func luaStartsStatement(t luaToken) bool {
	switch t.kind {
	case '0', 's':
		return true
	case 'n':
		return !luaKeyword(t.text) || t.text == "then" || t.text == "do" || t.text == "else" || t.text == "end"
	}
	return t.text == ")" || t.text == "]" || t.text == "}" || t.text == ";"
}

func luaKeyword(s string) bool {
	switch s {
	case "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
		"local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while", "goto":
		return true
	}
	return false
}

// luaSwap swaps the branches of the if at toks[k] (its then at toks[then])
// when it is "if c then A else B end" with A and B holding no block.
func luaSwap(file, src string, toks []luaToken, k, then int) (mutant, bool) {
	els := -1
	for j := then + 1; j < len(toks); j++ {
		t := toks[j]
		if t.kind != 'n' {
			continue
		}
		switch {
		case luaBlockOpeners[t.text] || t.text == "elseif":
			return mutant{}, false
		case t.text == "else" && els < 0:
			els = j
		case t.text == "end":
			if els < 0 {
				return mutant{}, false
			}
			a, b := src[toks[then].close:toks[els].off], src[toks[els].close:t.off]
			return mutant{ID: fmt.Sprintf("%s:%d:%d:swap", file, toks[k].line, toks[k].col),
				File: file, Start: toks[then].close, End: t.off, New: b + "else" + a}, true
		}
	}
	return mutant{}, false
}
