// Text from a user's file as an error message shows it.
#ifndef REMAT_BASE_TEXT_H_
#define REMAT_BASE_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace remat {

// Quoted, cut short after `max` bytes ("...'"), and with every byte that is
// not printable ASCII written as \xNN, so binary input never reaches the
// terminal raw.
std::string QuoteForMessage(std::string_view text, std::size_t max = 40);

}  // namespace remat

#endif  // REMAT_BASE_TEXT_H_
