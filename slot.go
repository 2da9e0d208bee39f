package dlock

// Redis Cluster maps a key to one of 16384 slots by the CRC16 (XMODEM variant) of its hash tag:
// the part between the first '{' and the next '}' when that part is not empty, else the whole
// key. Every key and channel of a lock shares the tag {name}, so one slot.

const clusterSlots = 16384

var crc16tab = func() (t [256]uint16) {
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

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^s[i]]
	}
	return crc
}

// keySlot returns the cluster slot of key.
func keySlot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return int(crc16(key)) % clusterSlots
				}
			}
			break
		}
	}
	return int(crc16(key)) % clusterSlots
}
