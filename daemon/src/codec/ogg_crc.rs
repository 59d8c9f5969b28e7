//! CRC-32 of Ogg pages (RFC 3533 §6): polynomial 0x04c11db7, initial value 0,
//! no bit reflection, no final XOR, computed over the whole page with the CRC
//! field (bytes 22..26) taken as zero.

const OGG_CRC_POLY: u32 = 0x04c1_1db7;

/// Byte-at-a-time lookup table, built at compile time.
const OGG_CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut r = (i as u32) << 24;
        let mut bit = 0;
        while bit < 8 {
            r = if r & 0x8000_0000 != 0 {
                (r << 1) ^ OGG_CRC_POLY
            } else {
                r << 1
            };
            bit += 1;
        }
        table[i] = r;
        i += 1;
    }
    table
};

/// Continues a CRC over `bytes` (start with `crc = 0`).
#[inline]
pub fn ogg_crc_update(mut crc: u32, bytes: &[u8]) -> u32 {
    for &b in bytes {
        crc = (crc << 8) ^ OGG_CRC_TABLE[((crc >> 24) as u8 ^ b) as usize];
    }
    crc
}

/// CRC of a complete page whose bytes 22..26 hold anything: they count as zero.
///
/// `page` must be at least 27 bytes long (a page header); shorter input gives
/// the CRC of the bytes as they are.
pub fn ogg_page_crc(page: &[u8]) -> u32 {
    if page.len() < 26 {
        return ogg_crc_update(0, page);
    }
    let crc = ogg_crc_update(0, &page[..22]);
    let crc = ogg_crc_update(crc, &[0u8; 4]);
    ogg_crc_update(crc, &page[26..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-by-bit reference implementation.
    fn crc_bitwise(bytes: &[u8]) -> u32 {
        let mut crc = 0u32;
        for &b in bytes {
            crc ^= (b as u32) << 24;
            for _ in 0..8 {
                crc = if crc & 0x8000_0000 != 0 {
                    (crc << 1) ^ OGG_CRC_POLY
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    #[test]
    fn table_matches_bitwise_reference() {
        let data: Vec<u8> = (0..1000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert_eq!(ogg_crc_update(0, &data), crc_bitwise(&data));
        // Check value of the Ogg CRC (non-reflected 0x04c11db7, init 0, no xorout).
        assert_eq!(ogg_crc_update(0, b"123456789"), 0x89a1_897f);
    }

    #[test]
    fn page_crc_ignores_crc_field() {
        let mut page = [7u8; 40];
        let a = ogg_page_crc(&page);
        page[22..26].copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(ogg_page_crc(&page), a);
    }
}
