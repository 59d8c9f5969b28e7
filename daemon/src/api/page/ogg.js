// Ogg pages for Opus (RFC 3533, RFC 7845), as /api/chat speaks them.
//
// OggOpusWriter: OpusHead alone in page 0 (BOS), OpusTags in page 1, then one
// audio packet per page, granule positions at 48 kHz. OggReader: bytes in any
// split, whole packets out (packets may span pages), CRC checked.
//
// Both allocate per page (a page is one WebSocket message's worth of bytes);
// neither keeps more than one partial page.

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let r = i << 24;
    for (let j = 0; j < 8; j++) r = r & 0x80000000 ? (r << 1) ^ 0x04c11db7 : r << 1;
    t[i] = r >>> 0;
  }
  return t;
})();

/** The Ogg CRC-32 (polynomial 0x04c11db7, no reflection, initial 0). */
export function oggCrc(bytes) {
  let crc = 0;
  for (let i = 0; i < bytes.length; i++) {
    crc = ((crc << 8) ^ CRC_TABLE[((crc >>> 24) ^ bytes[i]) & 0xff]) >>> 0;
  }
  return crc;
}

const FLAG_CONTINUED = 0x01;
const FLAG_BOS = 0x02;
const FLAG_EOS = 0x04;
const HEADER_BYTES = 27;
const MAX_PACKET_BYTES = 255 * 255 - 1;

/** An OpusHead packet (RFC 7845 §5.1), mono, channel mapping family 0. */
export function opusHead({ channels = 1, preSkip = 312, inputRate = 48000 } = {}) {
  const b = new Uint8Array(19);
  b.set(new TextEncoder().encode("OpusHead"), 0);
  const v = new DataView(b.buffer);
  b[8] = 1;
  b[9] = channels;
  v.setUint16(10, preSkip, true);
  v.setUint32(12, inputRate, true);
  v.setInt16(16, 0, true);
  b[18] = 0;
  return b;
}

/** An OpusTags packet (RFC 7845 §5.2) with a vendor string and no comments. */
export function opusTags(vendor) {
  const vend = new TextEncoder().encode(vendor);
  const b = new Uint8Array(8 + 4 + vend.length + 4);
  b.set(new TextEncoder().encode("OpusTags"), 0);
  const v = new DataView(b.buffer);
  v.setUint32(8, vend.length, true);
  b.set(vend, 12);
  v.setUint32(12 + vend.length, 0, true);
  return b;
}

/** Reads OpusHead's fields; throws on anything else. */
export function parseOpusHead(b) {
  if (b.length < 19 || new TextDecoder().decode(b.subarray(0, 8)) !== "OpusHead") {
    throw new Error("the stream does not start with OpusHead");
  }
  const v = new DataView(b.buffer, b.byteOffset, b.byteLength);
  return { channels: b[9], preSkip: v.getUint16(10, true), inputRate: v.getUint32(12, true) };
}

/** Makes the pages of one Ogg Opus stream. */
export class OggOpusWriter {
  constructor(serial = (Math.random() * 0x100000000) >>> 0) {
    this.serial = serial;
    this.sequence = 0;
    this.granule = 0;
  }

  /** Page 0 (OpusHead, BOS) and page 1 (OpusTags), concatenated. */
  headers(head, vendor) {
    const p0 = this.page(head, 0, FLAG_BOS);
    const p1 = this.page(opusTags(vendor), 0, 0);
    const out = new Uint8Array(p0.length + p1.length);
    out.set(p0, 0);
    out.set(p1, p0.length);
    return out;
  }

  /** One page holding one audio packet of `samples48k` samples at 48 kHz. */
  audio(packet, samples48k, last = false) {
    this.granule += samples48k;
    return this.page(packet, this.granule, last ? FLAG_EOS : 0);
  }

  page(packet, granule, flags) {
    if (packet.length > MAX_PACKET_BYTES) throw new Error("Opus packet too large for one page");
    const nseg = Math.floor(packet.length / 255) + 1;
    const page = new Uint8Array(HEADER_BYTES + nseg + packet.length);
    const v = new DataView(page.buffer);
    page.set([0x4f, 0x67, 0x67, 0x53], 0); // "OggS"
    page[4] = 0;
    page[5] = flags;
    v.setUint32(6, granule % 0x100000000, true);
    v.setUint32(10, Math.floor(granule / 0x100000000), true);
    v.setUint32(14, this.serial, true);
    v.setUint32(18, this.sequence++, true);
    v.setUint32(22, 0, true);
    page[26] = nseg;
    for (let i = 0; i < nseg - 1; i++) page[HEADER_BYTES + i] = 255;
    page[HEADER_BYTES + nseg - 1] = packet.length % 255;
    page.set(packet, HEADER_BYTES + nseg);
    v.setUint32(22, oggCrc(page), true);
    return page;
  }
}

/** Whole packets out of Ogg bytes that arrive in any split. */
export class OggReader {
  constructor({ maxPacketBytes = 1 << 20 } = {}) {
    this.buf = new Uint8Array(0);
    this.partial = [];
    this.partialBytes = 0;
    this.maxPacketBytes = maxPacketBytes;
  }

  /**
   * Adds bytes; returns the packets they complete, each
   * `{ data, granule, bos, sequence }` (granule: of the page it ends on).
   */
  push(bytes) {
    const joined = new Uint8Array(this.buf.length + bytes.length);
    joined.set(this.buf, 0);
    joined.set(bytes, this.buf.length);
    const out = [];
    let at = 0;
    while (joined.length - at >= HEADER_BYTES) {
      if (joined[at] !== 0x4f || joined[at + 1] !== 0x67 || joined[at + 2] !== 0x67 || joined[at + 3] !== 0x53) {
        throw new Error("bad Ogg data: no page where one should start");
      }
      const nseg = joined[at + 26];
      if (joined.length - at < HEADER_BYTES + nseg) break;
      let body = 0;
      for (let i = 0; i < nseg; i++) body += joined[at + HEADER_BYTES + i];
      const size = HEADER_BYTES + nseg + body;
      if (joined.length - at < size) break;
      const page = joined.slice(at, at + size);
      this.readPage(page, nseg, out);
      at += size;
    }
    this.buf = joined.slice(at);
    return out;
  }

  readPage(page, nseg, out) {
    const v = new DataView(page.buffer);
    const crc = v.getUint32(22, true);
    v.setUint32(22, 0, true);
    if (oggCrc(page) !== crc) throw new Error("bad Ogg data: page checksum mismatch");
    const flags = page[5];
    const granule = v.getUint32(6, true) + v.getUint32(10, true) * 0x100000000;
    const sequence = v.getUint32(18, true);
    if (!(flags & FLAG_CONTINUED)) {
      this.partial = [];
      this.partialBytes = 0;
    }
    let offset = HEADER_BYTES + nseg;
    let start = offset;
    for (let i = 0; i < nseg; i++) {
      const lace = page[HEADER_BYTES + i];
      offset += lace;
      if (lace < 255) {
        this.partial.push(page.subarray(start, offset));
        this.partialBytes += offset - start;
        out.push({ data: concat(this.partial, this.partialBytes), granule, bos: !!(flags & FLAG_BOS), sequence });
        this.partial = [];
        this.partialBytes = 0;
        start = offset;
      }
    }
    if (start < offset) {
      this.partial.push(page.subarray(start, offset));
      this.partialBytes += offset - start;
      if (this.partialBytes > this.maxPacketBytes) throw new Error("bad Ogg data: packet too large");
    }
  }
}

function concat(parts, total) {
  if (parts.length === 1) return parts[0].slice();
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/**
 * Samples at 48 kHz in one Opus packet, from its TOC byte (RFC 6716 §3.1);
 * 0 for an empty packet.
 */
export function opusPacketSamples48k(packet) {
  if (packet.length === 0) return 0;
  const toc = packet[0];
  const config = toc >> 3;
  let frameSamples; // one frame, at 48 kHz
  if (config < 12) frameSamples = [480, 960, 1920, 2880][config % 4];
  else if (config < 16) frameSamples = [480, 960][config % 2];
  else frameSamples = [120, 240, 480, 960][config % 4];
  const code = toc & 3;
  let frames = 1;
  if (code === 1 || code === 2) frames = 2;
  else if (code === 3) frames = packet.length > 1 ? packet[1] & 0x3f : 0;
  return frames * frameSamples;
}
