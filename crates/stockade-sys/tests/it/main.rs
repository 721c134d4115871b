//! stockade-sys: G1, G2.

mod sys;
