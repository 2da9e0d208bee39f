// Package slot computes Redis Cluster hash slots, for the core (renewal batches must not cross a
// slot), the adapters (sharded pub/sub and WAIT batches go to a slot's owner) and the test
// harness. A key's slot is the CRC-16/XMODEM of its hash tag (the part between the first '{'
// and the next '}', when that part is not empty), else of the whole key, modulo 16384.
package slot

// Count is the number of hash slots of a Redis Cluster.
const Count = 16384

var table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// CRC16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0) of s.
func CRC16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ table[byte(crc>>8)^s[i]]
	}
	return crc
}

// Of returns the cluster slot of key.
func Of(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				return int(CRC16(key)) % Count
			}
		}
		break
	}
	return int(CRC16(key)) % Count
}
