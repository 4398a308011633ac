package goredis

import (
	"strconv"
	"strings"
	"time"
)

// commandKey returns the key a command is routed by: the first key after
// numkeys for EVAL, EVALSHA, FCALL and their _RO forms, the first key after
// the timeout and count for BLMPOP and BZMPOP, nothing for commands without
// keys, and the first argument otherwise. On a cluster, a pipeline goes to
// the master of its first keyed command.
func commandKey(cmd string, args []interface{}) (string, bool) {
	switch up := strings.ToUpper(cmd); up {
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO":
		return keyAfterCount(args, 1)
	case "BLMPOP", "BZMPOP":
		return keyAfterCount(args, 1)
	case "LMPOP", "ZMPOP":
		return keyAfterCount(args, 0)
	default:
		if _, ok := keyless[up]; ok || len(args) == 0 {
			return "", false
		}
		return argString(args[0])
	}
}

// keyless lists the commands without a key.
var keyless = map[string]struct{}{
	"PING": {}, "ECHO": {}, "TIME": {}, "INFO": {}, "WAIT": {}, "WAITAOF": {},
	"CLUSTER": {}, "COMMAND": {}, "CLIENT": {}, "CONFIG": {}, "SCRIPT": {},
	"FUNCTION": {}, "DBSIZE": {}, "SELECT": {}, "AUTH": {}, "HELLO": {},
	"ROLE": {}, "MEMORY": {}, "FLUSHALL": {}, "FLUSHDB": {}, "RANDOMKEY": {},
	"KEYS": {}, "SCAN": {}, "DEBUG": {}, "PUBLISH": {}, "PUBSUB": {},
	"MULTI": {}, "EXEC": {}, "DISCARD": {}, "UNWATCH": {}, "SLOWLOG": {},
	"LATENCY": {}, "LASTSAVE": {}, "ACL": {},
}

func keyAfterCount(args []interface{}, skip int) (string, bool) {
	if len(args) <= skip+1 {
		return "", false
	}
	n, ok := argString(args[skip])
	if !ok {
		return "", false
	}
	if k, err := strconv.Atoi(n); err != nil || k < 1 {
		return "", false
	}
	return argString(args[skip+1])
}

func argString(a interface{}) (string, bool) {
	switch a := a.(type) {
	case string:
		return a, true
	case []byte:
		return string(a), true
	}
	return "", false
}

// blockTime returns the total timeout of the blocking commands among cmds
// (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BZPOPMIN, BZPOPMAX, BLMPOP, BZMPOP),
// whether there is any, and 0 if one of them blocks for ever.
func blockTime(cmds []command) (time.Duration, bool) {
	var total time.Duration
	blocking, forever := false, false
	for _, c := range cmds {
		var arg interface{}
		switch strings.ToUpper(c.name) {
		case "BLPOP", "BRPOP", "BLMOVE", "BRPOPLPUSH", "BZPOPMIN", "BZPOPMAX":
			if len(c.args) > 0 {
				arg = c.args[len(c.args)-1]
			}
		case "BLMPOP", "BZMPOP":
			if len(c.args) > 0 {
				arg = c.args[0]
			}
		default:
			continue
		}
		blocking = true
		secs, ok := seconds(arg)
		if !ok || secs == 0 {
			forever = true
			continue
		}
		total += time.Duration(secs * float64(time.Second))
	}
	if forever {
		return 0, blocking
	}
	return total, blocking
}

func seconds(a interface{}) (float64, bool) {
	switch a := a.(type) {
	case int:
		return float64(a), true
	case int64:
		return float64(a), true
	case float64:
		return a, true
	case string:
		f, err := strconv.ParseFloat(a, 64)
		return f, err == nil
	case []byte:
		f, err := strconv.ParseFloat(string(a), 64)
		return f, err == nil
	}
	return 0, false
}
