package cluster

// SlotCount is the number of hash slots of a Redis Cluster.
const SlotCount = 16384

// Slot returns the hash slot of key as Redis Cluster computes it: CRC16
// (XMODEM) of the key modulo 16384, or of its hash tag when the key holds one.
// The hash tag is the text between the first '{' and the first '}' after it,
// and only when that text is not empty: "a{b}c" hashes "b", "a{}b" and "a}b{"
// hash the whole key. redsem's keys of one semaphore share a tag, so they
// share a slot.
func Slot(key string) int {
	if i := indexByte(key, '{'); i >= 0 {
		if j := indexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % SlotCount)
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// crcTable is CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for j := 0; j < 8; j++ {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(s string) uint16 {
	var c uint16
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crcTable[byte(c>>8)^s[i]]
	}
	return c
}
