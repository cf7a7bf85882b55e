/** Recorded in ownership marks; a unit test keeps it equal to package.json's version. */
export const packageVersion = "0.1.0";
