//! Arithmetic modulo the crc32c polynomial, in the reflected representation crc32c uses (the
//! top bit of a `u32` is the coefficient of x^0): what joins checksums of consecutive pieces,
//! and what the folding engine's constants are made of.

/// The crc32c polynomial, reflected.
const POLY: u32 = 0x82F6_3B78;
/// The polynomial 1, reflected.
const ONE: u32 = 1 << 31;

/// `a * b` modulo the polynomial.
pub const fn mul_mod_p(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = ONE;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        bit >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    product
}

/// `x^(2^k)` modulo the polynomial, for k in 0..64.
const X_POW_2K: [u32; 64] = {
    let mut table = [0; 64];
    table[0] = ONE >> 1; // x^1
    let mut k = 1;
    while k < 64 {
        table[k] = mul_mod_p(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `x^(n * 2^shift)` modulo the polynomial: one multiplication per set bit of `n`.
pub const fn x_pow(n: u64, shift: usize) -> u32 {
    let mut power = ONE;
    let mut k = shift;
    let mut n = n;
    while n != 0 {
        if n & 1 != 0 {
            power = mul_mod_p(X_POW_2K[k % 64], power);
        }
        n >>= 1;
        k += 1;
    }
    power
}

/// The crc32c of bytes `A ++ B`, given `first` = crc32c(A), `second` = crc32c(B) and B's
/// length. Well under a microsecond whatever the length (the `crc32c` crate's own combine
/// takes tens of microseconds).
pub fn combine(first: u32, second: u32, second_len: u64) -> u32 {
    // Appending `second_len` zero bytes multiplies the CRC register by x^(8 * second_len)
    // modulo the polynomial; B's own checksum then adds in. The pre- and post-conditioning
    // of crc32c cancel out in this form.
    mul_mod_p(x_pow(second_len, 3), first) ^ second
}
