//! Checks of the Ogg Opus stream a client received: whole pages, in
//! order, one 40 ms packet's worth of granule per audio page.

/// The `(granule position, page sequence number)` of every Ogg page in `bytes`.
pub fn ogg_pages(bytes: &[u8]) -> Vec<(u64, u32)> {
    let mut pages = Vec::new();
    let mut at = 0;
    while at + 27 <= bytes.len() {
        assert_eq!(&bytes[at..at + 4], b"OggS", "not an Ogg page at byte {at}");
        let granule = u64::from_le_bytes(bytes[at + 6..at + 14].try_into().unwrap());
        let seq = u32::from_le_bytes(bytes[at + 18..at + 22].try_into().unwrap());
        let nseg = bytes[at + 26] as usize;
        let body: usize = bytes[at + 27..at + 27 + nseg]
            .iter()
            .map(|&b| b as usize)
            .sum();
        pages.push((granule, seq));
        at += 27 + nseg + body;
    }
    assert_eq!(at, bytes.len(), "trailing bytes after the last Ogg page");
    pages
}

/// Audio messages are whole Ogg pages whose sequence numbers are consecutive
/// and whose granule grows by one 40 ms packet (1920 at 48 kHz) per audio page.
pub fn assert_audio_in_order(payloads: &[Vec<u8>], who: &str) {
    let mut next_seq = 0u32;
    let mut granule = 0u64;
    for (i, p) in payloads.iter().enumerate() {
        for (g, seq) in ogg_pages(p) {
            assert_eq!(seq, next_seq, "{who}: audio message {i}: page out of order");
            next_seq += 1;
            if g != 0 {
                assert_eq!(g, granule + 1920, "{who}: audio message {i}: granule jump");
                granule = g;
            }
        }
    }
}
