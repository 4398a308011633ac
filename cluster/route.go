package cluster

import (
	"fmt"
	"strconv"
	"strings"
)

// commandKey returns the key a command is routed by: the first key after
// numkeys for EVAL, EVALSHA, FCALL and their _RO forms, the first key after
// the count for the *MPOP family, the first stream of XREAD and XREADGROUP,
// nothing for commands without keys, and the first argument otherwise.
func commandKey(cmd string, args []interface{}) (string, bool) {
	switch up := strings.ToUpper(cmd); up {
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO":
		return keyAfterCount(args, 1)
	case "LMPOP", "ZMPOP", "SINTERCARD", "ZDIFF", "ZINTER", "ZUNION", "ZINTERCARD":
		return keyAfterCount(args, 0)
	case "BLMPOP", "BZMPOP":
		return keyAfterCount(args, 1)
	case "XREAD", "XREADGROUP":
		for i, a := range args {
			if s, ok := argString(a); ok && strings.EqualFold(s, "STREAMS") {
				return arg(args, i+1)
			}
		}
		return "", false
	default:
		if _, ok := keyless[up]; ok {
			return "", false
		}
		return arg(args, 0)
	}
}

// keyless lists the commands that carry no key; they go to the node the
// connection already uses, or to any master.
var keyless = map[string]struct{}{
	"": {}, "PING": {}, "ECHO": {}, "TIME": {}, "INFO": {}, "WAIT": {}, "WAITAOF": {},
	"ASKING": {}, "READONLY": {}, "READWRITE": {}, "CLUSTER": {}, "COMMAND": {},
	"CLIENT": {}, "CONFIG": {}, "SCRIPT": {}, "FUNCTION": {}, "DBSIZE": {},
	"SELECT": {}, "AUTH": {}, "HELLO": {}, "QUIT": {}, "RESET": {}, "MULTI": {},
	"EXEC": {}, "DISCARD": {}, "UNWATCH": {}, "ROLE": {}, "LASTSAVE": {},
	"SLOWLOG": {}, "LATENCY": {}, "MEMORY": {}, "FLUSHALL": {}, "FLUSHDB": {},
	"RANDOMKEY": {}, "KEYS": {}, "SCAN": {}, "DEBUG": {}, "MONITOR": {},
	"SUBSCRIBE": {}, "PSUBSCRIBE": {}, "UNSUBSCRIBE": {}, "PUNSUBSCRIBE": {},
	"PUBLISH": {}, "PUBSUB": {}, "SAVE": {}, "BGSAVE": {}, "BGREWRITEAOF": {},
	"SWAPDB": {}, "FAILOVER": {}, "REPLICAOF": {}, "SLAVEOF": {}, "SHUTDOWN": {},
}

// keyAfterCount returns the first key of args laid out as
// [skip args...] numkeys key...; none when numkeys is 0.
func keyAfterCount(args []interface{}, skip int) (string, bool) {
	n, ok := argString(argAt(args, skip))
	if !ok {
		return "", false
	}
	if k, err := strconv.Atoi(n); err != nil || k < 1 {
		return "", false
	}
	return arg(args, skip+1)
}

func argAt(args []interface{}, i int) interface{} {
	if i < len(args) {
		return args[i]
	}
	return nil
}

func arg(args []interface{}, i int) (string, bool) {
	if i >= len(args) {
		return "", false
	}
	return argString(args[i])
}

// argString formats an argument the way redigo writes it on the wire.
func argString(a interface{}) (string, bool) {
	switch v := a.(type) {
	case nil:
		return "", false
	case string:
		return v, true
	case []byte:
		return string(v), true
	case int:
		return strconv.Itoa(v), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case fmt.Stringer:
		return v.String(), true
	default:
		return fmt.Sprint(v), true
	}
}

// isWrite reports whether a command may write, so that the WAIT option
// waits for replicas after it. Read-only and keyless commands do not.
func isWrite(cmd string) bool {
	up := strings.ToUpper(cmd)
	if _, ok := keyless[up]; ok {
		return false
	}
	_, ro := readOnly[up]
	return !ro
}

var readOnly = map[string]struct{}{
	"GET": {}, "MGET": {}, "EXISTS": {}, "TYPE": {}, "TTL": {}, "PTTL": {},
	"STRLEN": {}, "LLEN": {}, "LRANGE": {}, "LINDEX": {}, "LPOS": {},
	"HGET": {}, "HMGET": {}, "HGETALL": {}, "HLEN": {}, "HEXISTS": {}, "HKEYS": {}, "HVALS": {},
	"ZSCORE": {}, "ZMSCORE": {}, "ZRANGE": {}, "ZRANGEBYSCORE": {}, "ZREVRANGE": {},
	"ZCARD": {}, "ZCOUNT": {}, "ZRANK": {}, "ZREVRANK": {},
	"SCARD": {}, "SMEMBERS": {}, "SISMEMBER": {}, "SMISMEMBER": {},
	"EVAL_RO": {}, "EVALSHA_RO": {}, "FCALL_RO": {}, "OBJECT": {}, "DUMP": {},
	"GETRANGE": {}, "BITCOUNT": {}, "XRANGE": {}, "XLEN": {},
}
