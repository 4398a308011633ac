package goredis_test

import (
	"fmt"
	"strings"

	"github.com/redsem/redsem/goredis"
)

// The least-privilege Redis user for redsem on a go-redis client, under the
// default prefix: admin.ACLCommands and the CLIENT ID and CLIENT UNBLOCK
// that the adapter's blocking waits send.
func ExampleACLCommands() {
	fmt.Println("ACL SETUSER redsem-app on >secret resetkeys ~redsem:* resetchannels -@all +" +
		strings.Join(goredis.ACLCommands(), " +"))
	// Output:
	// ACL SETUSER redsem-app on >secret resetkeys ~redsem:* resetchannels -@all +blmove +blpop +client|id +client|unblock +del +eval +evalsha +exists +hdel +hget +hgetall +hincrby +hkeys +hmget +hset +hsetnx +lindex +llen +lpop +lpush +lrange +lrem +persist +pexpire +pexpireat +rpush +script|load +time +type +zadd +zincrby +zmscore +zrange +zrangebyscore +zrem +zscore
}
